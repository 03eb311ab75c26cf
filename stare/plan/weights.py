"""What the weight sync holds on a GPU (the learner's send buffers and device snapshot, a rollout
worker's receive buffers) and what the learner's checkpoints take on disk; stare.plan.gpu_memory's
docstring has the formulas."""

from __future__ import annotations

from typing import Any

from stare.config import TrainConfig, staleness
from stare.plan.sizes import DTYPE_BYTES, ModelShape
from stare.weight_sync.factory import receive_buffer_sets


def nccl_weight_sync(cfg: TrainConfig) -> bool:
    """Whether the weights may travel by NCCL, GPU to GPU (`system.weight_sync: broadcast`,
    communicator `auto` or `nccl`, tensor_parallel_size 1; stare.weight_sync.factory). Else gloo
    moves them through CPU memory, or the filesystem backend through disk."""
    from stare.weight_sync.factory import communicator_setting

    return cfg.system.weight_sync == "broadcast" and communicator_setting(cfg, rollout_end=True) != "gloo"


def weight_receive_bytes(cfg: TrainConfig, weights: int) -> int:
    """GPU memory of the rollout worker's weight-sync receive buffers: whole-model sets over NCCL (two,
    one with in-flight weight updates: stare.weight_sync.factory.receive_buffer_sets), none otherwise."""
    return receive_buffer_sets(cfg) * weights if nccl_weight_sync(cfg) else 0


def weight_send_bytes(cfg: TrainConfig, shape: ModelShape, b: int, where: str | None = None) -> int:
    """GPU memory of the learner's NCCL weight send (stare.weight_sync.buckets), beside the next
    step's peak when it publishes in the background: two packing buckets, and, published from the
    host, each of the two messages in flight may be a whole large tensor copied to the GPU."""
    if not nccl_weight_sync(cfg):
        return 0
    copied = 0 if (where or _publish_from(cfg)) == "device" else 2 * b * shape.largest_layer_params
    return 2 * cfg.system.weight_sync_bucket_mb * 2**20 + copied


def _publish_from(cfg: TrainConfig) -> str:
    from stare.weight_sync.factory import publish_from

    return publish_from(cfg, cuda=True)  # a plan is for GPUs


def weight_snapshot_bytes(cfg: TrainConfig, shape: ModelShape, b: int, stage: int) -> tuple[int, str]:
    """GPU memory of the weights published from the device on rank 0 (learner/engine/deepspeed_engine.py
    full_state_dict): none for a synchronous publish under ZeRO 0-2 (the parameters themselves)."""
    if _publish_from(cfg) != "device":
        return 0, ""
    copies = 2 if staleness(cfg).off_policy else int(stage == 3)
    why = "a background publish: the copy being sent and the next" if copies == 2 else "ZeRO-3: the gathered model"
    return copies * b * shape.params, f"{copies} x the model in {cfg.model.dtype} on rank 0 ({why})"


def reference_bytes(cfg: TrainConfig, shape: ModelShape, b: int, stage: int, gpus: int) -> tuple[int, str]:
    """GPU memory of the frozen reference policy of `loss.ref_kl` on each learner rank (learner/step/reference.py):
    ZeRO 0-2 a whole copy in the model dtype, b P; ZeRO-3 partitioned like the policy's 16-bit weights, b P / N,
    plus the layer its forward has gathered and the one it prefetches, 2 b x largest layer; with LoRA none (the
    policy with its adapters off). Its log-probs ([rows, response] fp32) are small beside these."""
    if cfg.loss.ref_kl is None or cfg.model.lora is not None:
        return 0, ""
    if stage == 3:
        return (
            -(-b * shape.params // gpus) + 2 * b * shape.largest_layer_params,
            f"loss.ref_kl: the base model sharded over {gpus} GPU(s) (ZeRO-3), plus 2 gathered layers",
        )
    return (
        b * shape.params,
        f"loss.ref_kl: the base model whole in {cfg.model.dtype} (ZeRO-{stage} leaves it unsharded)",
    )


def checkpoint_disk(cfg: TrainConfig, shape: ModelShape) -> dict[str, Any]:
    """Disk of the learner's checkpoints (DeepSpeed's files): the fp32 master weights and the two
    Adam moments, 12 B a trained parameter (with LoRA the adapters' only: the frozen base is not saved), plus the module's weights in the model dtype below ZeRO-3 (under
    ZeRO-3 they are the partitioned master copy). While one is written the `keep` older ones stay
    (pruned once it is whole): keep + 1 at the peak. docs/recipes.md, "Checkpoint disk"."""
    per_param = 12 + (DTYPE_BYTES[cfg.model.dtype] if cfg.optim.zero_stage < 3 and cfg.model.dtype != "float32" else 0)
    trained = shape.params
    if (lora := cfg.model.lora) is not None:  # the checkpoint holds the adapters (their weights and optimizer state)
        from stare.plan.sizes import lora_params

        trained = lora_params(shape, lora.target_modules, lora.r)
    each = per_param * trained
    r = cfg.run
    return {
        "bytes": each,
        "every": r.checkpoint_every,
        "keep": r.keep_checkpoints,
        "peak_bytes": (r.keep_checkpoints + 1) * each,
        # run.steps null (derived from data.epochs when the run starts): not known here
        "written_bytes": None if r.steps is None else -(-r.steps // r.checkpoint_every) * each,
    }
