"""A decoder-only model's shape (from its config.json, no weights) and what its states,
activations and KV cache weigh: the arithmetic the memory plan (stare.plan.gpu_memory) and the
throughput model share. The formulas are in stare.plan.gpu_memory's docstring."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from stare.config import ConfigError, TrainConfig

if TYPE_CHECKING:
    from transformers import PretrainedConfig

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


@dataclass(frozen=True)
class ModelShape:
    """What the plan needs of a decoder-only model; no weights."""

    params: int  # unique parameters (tied embeddings once)
    largest_layer_params: int  # largest module's own parameters (ZeRO-3 gathers one at a time)
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    max_positions: int
    source: str  # where the shape came from

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim


# [chunk, V] fp32 tensors the chunked log-prob computation holds at once (learner/step/logprobs.py;
# tests/learner/test_logprobs.py counts them): the fused path, for a whole output head and (ZeRO-3)
# for the head `ChunkedHead` gathers once per micro-batch (the gathered [V, H] weight and its
# gradient: DeepSpeed's largest-layer term of the ZeRO-3 model states, the head being the largest).
CHUNK_TENSORS = {False: 2, True: 2}


def shape_from_hf_config(hf_config: PretrainedConfig, source: str) -> ModelShape:
    """Count parameters by building the model on the meta device: no memory, seconds for 7B."""
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(hf_config)
    params = sum({id(p): p.numel() for p in model.parameters()}.values())
    largest = max(sum(p.numel() for p in m.parameters(recurse=False)) for m in model.modules())
    text = hf_config.get_text_config() if hasattr(hf_config, "get_text_config") else hf_config
    heads = text.num_attention_heads
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // heads
    return ModelShape(
        params=params,
        largest_layer_params=largest,
        hidden=text.hidden_size,
        layers=text.num_hidden_layers,
        heads=heads,
        kv_heads=getattr(text, "num_key_value_heads", None) or heads,
        head_dim=head_dim,
        intermediate=text.intermediate_size,
        vocab=text.vocab_size,
        max_positions=getattr(text, "max_position_embeddings", 1 << 20),
        source=source,
    )


def load_model_shape(cfg: TrainConfig, model_config: Path | None = None) -> ModelShape:
    """The shape of `model_config` (an HF config.json or its folder), else of model.path, else of
    the bundled tiny model (its cached build's config, or its spec with the vocabulary bounded)."""
    from transformers import AutoConfig, Qwen2Config

    path = model_config if model_config is not None else cfg.model.path
    if path is not None:
        path = Path(path)
        file = path / "config.json" if path.is_dir() else path
        if not file.is_file():
            field_name = "--model-config" if model_config is not None else "model.path"
            raise ConfigError(
                f"{field_name}: {file} does not exist; point it at a Hugging Face model folder or "
                "its config.json (stare plan --model-config FILE plans without the weights)"
            )
        return shape_from_hf_config(AutoConfig.from_pretrained(file), str(file))
    from stare.models.tiny.spec import TinyModelSpec, default_model_dir

    try:
        spec = TinyModelSpec(task_name=cfg.task.name, seed=cfg.model.tiny_seed, **cfg.model.tiny)
    except TypeError as err:
        raise ConfigError(f"model.tiny: {err}; valid keys are the fields of stare.models.tiny.TinyModelSpec") from None
    built = default_model_dir(spec) / "config.json"
    if built.is_file():
        return shape_from_hf_config(AutoConfig.from_pretrained(built), str(built))
    hf = Qwen2Config(
        vocab_size=256,
        hidden_size=spec.hidden_size,
        num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_kv_heads,
        intermediate_size=spec.intermediate_size,
        max_position_embeddings=spec.max_positions,
        tie_word_embeddings=True,
    )
    return shape_from_hf_config(hf, "the tiny model's spec (not built yet: vocabulary bounded by 256)")


def model_state_bytes(
    params: int, largest_layer_params: int, *, stage: int, gpus: int, dtype_bytes: int
) -> tuple[int, str]:
    """Weights + gradients + optimizer state per GPU at ZeRO `stage` over `gpus` ranks, and where
    the number comes from (see the module docstring)."""
    P, N = params, gpus
    if dtype_bytes == 4:
        by_stage = {0: 16 * P, 1: 8 * P + 8 * P // N, 2: 4 * P + 12 * P // N, 3: 16 * P // N + 4 * largest_layer_params}
        return by_stage[stage], "fp32: 4P weights + 4P grads + 8P Adam"
    _quiet_deepspeed_import()
    if stage == 3:
        from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs

        _, gpu, _ = estimate_zero3_model_states_mem_needs(
            total_params=P,
            largest_layer_params=largest_layer_params,
            num_gpus_per_node=N,
            num_nodes=1,
            cpu_offload=False,
            cpu_offload_params=False,
            zero_init=True,
        )
        return gpu, "deepspeed estimate_zero3_model_states_mem_needs"
    from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs

    if stage == 2:
        _, gpu = estimate_zero2_model_states_mem_needs(
            total_params=P, num_gpus_per_node=N, num_nodes=1, cpu_offload=False
        )
        return gpu, "deepspeed estimate_zero2_model_states_mem_needs"
    if stage == 0:
        _, gpu = estimate_zero2_model_states_mem_needs(
            total_params=P, num_gpus_per_node=1, num_nodes=1, cpu_offload=False
        )
        return gpu, "deepspeed estimate_zero2_model_states_mem_needs on 1 GPU (nothing sharded)"
    return 4 * P + 16 * P // N, "16-bit weights and grads whole + fp32 master and Adam sharded: 4P + 16P/N"


def _quiet_deepspeed_import() -> None:
    """Import DeepSpeed with its logger on stderr: it logs to stdout, which `stare plan --json` owns."""
    import contextlib
    import sys

    with contextlib.redirect_stdout(sys.stderr):
        import deepspeed  # noqa: F401


def layer_activation_bytes(shape: ModelShape, dtype_bytes: int) -> int:
    """Bytes one decoder layer keeps for backward, per token (see the module docstring)."""
    h, b = shape.hidden, dtype_bytes
    return 2 * (4 * h + 4 + 2 * b * h) + b * (2 * h + 2 * shape.kv_dim) + 4 * shape.heads + 4 * b * shape.intermediate


def activation_bytes(shape: ModelShape, dtype_bytes: int, tokens: int, *, checkpointing: bool) -> int:
    a_layer = layer_activation_bytes(shape, dtype_bytes)
    if checkpointing:
        return tokens * (shape.layers * dtype_bytes * shape.hidden + a_layer)
    return tokens * shape.layers * a_layer


def lora_params(shape: ModelShape, target_modules: list[str] | str, r: int) -> int:
    """Adapter parameters of model.lora: r x (fan-in + fan-out) per adapted linear of each layer
    (the standard attention and MLP projections; all-linear or another name counts all seven)."""
    q, kv, h, i = shape.heads * shape.head_dim, shape.kv_dim, shape.hidden, shape.intermediate
    fans = {
        "q_proj": h + q,
        "k_proj": h + kv,
        "v_proj": h + kv,
        "o_proj": q + h,
        "gate_proj": h + i,
        "up_proj": h + i,
        "down_proj": i + h,
    }
    names = fans if isinstance(target_modules, str) or not set(target_modules) <= set(fans) else target_modules
    return shape.layers * r * sum(fans[n] for n in names)


def kv_bytes_per_token(shape: ModelShape, dtype_bytes: int) -> int:
    return 2 * shape.layers * shape.kv_heads * shape.head_dim * dtype_bytes
