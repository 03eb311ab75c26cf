"""The sim's config adapter: a run config (+ the node) -> what the simulated node runs and what its
work costs.

The design knobs are the run config's own fields (system.rollout_streaming, system.inflight_weight_updates,
system.weight_sync_publish_from, rollout.engine.enforce_eager, ...), set with `--set` as for any run; the
rollout worker's streaming is decided by the product's own rule (`rollout.streaming.streaming_enabled`).
`rollout.engine.enforce_eager` is read with a default where the config section has none (the hf section):
None = auto, CUDA graphs on a GPU. The workload settings (`sim.*`: response lengths, solve rates, reward and
evaluation costs, the learner framework) are stare/app/sim/workload.py's.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stare.app.sim.constants import constants
from stare.app.sim.costs import ModelCosts, NodeCosts
from stare.app.sim.evaluation import evaluation_s
from stare.app.sim.gpus import gpu
from stare.app.sim.parts import Design, KvCache, StepCosts
from stare.app.sim.workload import CHOICES, SIM_FIELDS, LengthModel, length_model
from stare.config.train import keys_from_rollout

NEW_FIELDS = {
    "rollout.engine.enforce_eager": None,  # the hf section has none: auto
}


@dataclass
class SimSettings:
    knobs: dict[str, Any] = field(default_factory=dict)

    def get(self, key: str):
        return self.knobs.get(key, SIM_FIELDS.get(key, NEW_FIELDS.get(key)))


def split_overrides(cfg_path: Path | None, overrides: list[str]) -> tuple[list[str], SimSettings]:
    """(the overrides the config validates, the sim's own settings). A field of NEW_FIELDS stays an
    override when the config already has it."""
    from stare.config import TrainConfig, parse_override

    passed, knobs = [], {}
    for text in overrides:
        key, value = parse_override(text)
        if key in SIM_FIELDS or (key in NEW_FIELDS and not _config_has(TrainConfig, key)):
            knobs[key] = value
        else:
            passed.append(text)
    for key, allowed in CHOICES.items():
        if key in knobs and knobs[key] not in allowed:
            raise ValueError(f"{key}={knobs[key]!r}: choose one of {', '.join(allowed)} (--set {key}=...)")
    return passed, SimSettings(knobs)


def _config_has(model, dotted: str) -> bool:
    head, _, rest = dotted.partition(".")
    fields = getattr(model, "model_fields", {})
    if head not in fields:
        return False
    if not rest:
        return True
    ann = fields[head].annotation
    return any(_config_has(t, rest) for t in getattr(ann, "__args__", ()) or (ann,) if hasattr(t, "model_fields"))


def _read(cfg, sim: SimSettings, dotted: str):
    """A field from the config where it exists, else the sim setting / default (NEW_FIELDS)."""
    if dotted in sim.knobs:
        return sim.knobs[dotted]
    obj = cfg
    for part in dotted.split("."):
        if not hasattr(obj, part):
            return NEW_FIELDS[dotted]
        obj = getattr(obj, part)
    return obj


def build_design(
    cfg, sim: SimSettings, *, gpus: int, learner_gpus: int | None, colocated: bool, on_gpu: bool = True
) -> Design:
    from rollout.streaming import streaming_enabled
    from stare.app.sim.engine import SimEngine
    from stare.app.sim.lanes import Lane

    eng = cfg.rollout.engine
    eager = _read(cfg, sim, "rollout.engine.enforce_eager")
    if eager is None:  # auto: CUDA graphs where CUDA is present
        eager = not on_gpu
    learner = learner_gpus if learner_gpus is not None else cfg.system.learner_ranks
    if colocated:
        learner = gpus
    probe = SimEngine(Lane("probe", []), None, None, capacity=1, seed=0)  # a streaming engine, as both of ours
    return Design(
        gpus=gpus,
        learner_gpus=learner,
        rollout_tp=getattr(eng, "tensor_parallel_size", 1),
        colocated=colocated,
        streaming=streaming_enabled(cfg, probe),
        inflight=bool(_read(cfg, sim, "system.inflight_weight_updates")),
        publish_from=_publish_from(cfg, sim, on_gpu),
        eager=bool(eager),
        max_staleness=cfg.system.max_staleness,
    )


def engine_max_model_len(cfg, shape) -> int:
    """rollout.engine.max_model_len as a vLLM rollout engine of this run gets it (rollout/stack.py): the
    config's, else the run's prompt + response length within the model's positions."""
    from rollout.stack import run_max_model_len

    given = getattr(cfg.rollout.engine, "max_model_len", None)
    return int(given or run_max_model_len(cfg, shape.max_positions) or shape.max_positions)


def lengths_of(cfg, sim: SimSettings) -> LengthModel:
    return length_model(
        float(sim.get("sim.response_mean")),
        float(sim.get("sim.response_sigma")),
        cfg.rollout.max_new_tokens,
        growth=float(sim.get("sim.response_growth")),
        at_step=int(sim.get("sim.at_step")),
    )


def node_costs(cfg, sim: SimSettings, design: Design, shape, gpu_name: str, corner: str = "central") -> NodeCosts:
    return NodeCosts(
        gpu(gpu_name),
        ModelCosts(shape),
        constants(corner),
        tp=design.rollout_tp,
        eager=design.eager,
        framework=str(sim.get("sim.learner_framework")),
    )


def gpu_costs(cfg, sim: SimSettings, design: Design, shape, gpu_name: str, corner: str = "central") -> StepCosts:
    """The stand-ins' times on `gpu_name` GPUs (stare/app/sim/gpus.py) for a model of `shape`, with the cost
    model's constants at `corner` (stare/app/sim/constants.py)."""
    nc = node_costs(cfg, sim, design, shape, gpu_name, corner)
    eng, d = cfg.rollout.engine, design
    util = getattr(eng, "gpu_memory_utilization", 0.9)
    kv_tokens, max_seqs = nc.kv_capacity_tokens(util), getattr(eng, "max_num_seqs", 256)
    # what the streaming worker keeps in a vLLM engine at its start (VLLMEngine.capacity): max_num_seqs, bounded
    # by the sequences of max_model_len tokens the KV cache holds (max_model_len as the rollout stack resolves
    # it); the stand-in engine then sizes it from its finished samples' mean length as VLLMEngine does
    max_len = engine_max_model_len(cfg, shape)
    capacity = int(min(max_seqs, kv_tokens // max_len))
    if capacity < cfg.rollout.samples_per_prompt:
        raise ValueError(
            f"a rollout engine's KV cache holds {capacity} sequences of {max_len:,} tokens "
            f"(max_model_len), fewer than one group ({cfg.rollout.samples_per_prompt}): raise "
            "rollout.engine.gpu_memory_utilization or tensor_parallel_size, or lower max_model_len"
        )
    offload = bool(sim.get("sim.learner_offload")) or (d.colocated and cfg.system.colocate_offload == "optimizer")
    learn = LearnerCosts(nc, cfg, sim, d.learner_gpus, offload=offload)
    if d.colocated:
        gather, send, recv = 0.0, nc.refit_colocated_s(), 0.0
    elif d.publish_from == "device":  # a node of more than 8 GPUs: the learner and the engines on different nodes
        across = d.gpus > nc.gpus_per_node
        bcast = nc.broadcast_s(across_nodes=across)
        gather, send, recv = nc.publish_device_s(d.learner_gpus, learn.zero3), bcast, bcast
    else:  # host: D2H on the main thread; H2D per bucket and the broadcast on the publisher's
        h2d = nc.pageable_copy_s()
        gather = nc.publish_host_s(d.learner_gpus, learn.zero3) - h2d
        send = recv = h2d + nc.broadcast_s()
    workers = max(int(sim.get("sim.reward_workers")), 1)
    costs = StepCosts(
        engine=nc,
        capacity=max(capacity, 1),
        kv=KvCache(int(kv_tokens), int(max_seqs), int(max_len)),
        train_s=learn.train_s,
        phases_s=learn.phases,
        prepass_s=learn.prepass_s if cfg.optim.prepass_early and learn.prepass else None,
        gather_s=gather,
        send_s=send,
        recv_s=recv,
        checkpoint_s=nc.checkpoint_s(),
        swap_s=nc.sleep_wake_s() if d.colocated else 0.0,
        reward_s_per_traj=float(sim.get("sim.reward_s_per_traj")) / workers,
    )
    factor = float(sim.get("sim.eval_length_factor"))
    costs.eval_s = evaluation_s(
        cfg, d, costs, lengths_of(cfg, sim), prompt_len=int(sim.get("sim.prompt_tokens")), factor=factor
    )
    return costs


class LearnerCosts:
    """A step's learner time from its trajectories: token counts, micro-batches per rank, ZeRO-3 gathers."""

    def __init__(self, nc: NodeCosts, cfg, sim: SimSettings, gpus: int, *, offload: bool):
        o = cfg.optim
        self.nc, self.gpus, self.offload = nc, gpus, offload
        self.recompute, self.budget = o.gradient_checkpointing, o.max_tokens_per_micro_batch or 8192
        self.chunk, self.zero3 = o.logits_chunk_tokens, o.zero_stage == 3 and gpus > 1
        self.per_micro = sim.get("sim.zero3_head") == "per_micro_batch"
        self.extra = int(sim.get("sim.extra_forward"))
        # loss.selection_keys rollout: STARE ranks by the rollout's log-probs and the step runs no pre-pass
        self.prepass = not keys_from_rollout(cfg.loss)

    def _sizes(self, trajectories: list) -> tuple[int, int, float, int]:
        resp = sum(len(t.response_token_ids) for t in trajectories)
        tokens = resp + sum(len(t.prompt_token_ids) for t in trajectories)
        micro = max(math.ceil(tokens / self.gpus / self.budget), 1)
        return resp, tokens, tokens / max(len(trajectories), 1), micro

    def phases(self, trajectories: list) -> dict[str, float]:
        resp, tokens, mean_len, micro = self._sizes(trajectories)
        if self.per_micro:  # the head once per micro-batch of the pre-pass and of the training pass
            heads = 2 * micro
        else:  # per log-prob chunk in the pre-pass, the forward and the recompute
            heads = 3 * math.ceil(resp / self.gpus / self.chunk)
        return self.nc.learner_phases(
            tokens,
            mean_len,
            self.gpus,
            recompute=self.recompute,
            zero3=self.zero3,
            micro_batches=micro,
            prepass_micro_batches=micro,
            head_gathers=heads if self.prepass else heads // 2,
            extra_forward=self.extra,
            offload=self.offload,
            prepass=self.prepass,
        )

    def train_s(self, trajectories: list) -> float:
        return sum(self.phases(trajectories).values())

    def prepass_s(self, trajectories: list) -> float:
        """The share of `train_s` that a pre-pass ahead of the step (optim.prepass_early) takes out of it."""
        if not trajectories:
            return 0.0
        resp, tokens, mean_len, micro = self._sizes(trajectories)
        head = micro if self.per_micro else math.ceil(resp / self.gpus / self.chunk)
        t = self.nc.prepass_s(tokens, mean_len, self.gpus, zero3=self.zero3, micro_batches=micro)
        return t + (head * self.nc.allgather_s(self.nc.model.head_bytes, self.gpus) if self.zero3 else 0.0)


@dataclass(frozen=True)
class CpuDecode:
    """A transformers engine on one CPU core: an engine step costs a + b x rows."""

    a: float
    b: float

    def decode_span_s(self, steps: int, seqs: int, context_sum: float) -> float:
        return steps * (self.a + self.b * seqs)

    def prefill_s(self, tokens: float) -> float:
        return 0.0


def cpu_costs(profile: dict, cfg) -> tuple[StepCosts, LengthModel]:
    """The stand-ins' times from a profile measured on this machine (stare/app/sim/calibrate.py)."""
    dec = CpuDecode(profile["decode_a_s"], profile["decode_b_s"])
    lengths = LengthModel(profile["length_mean"], profile["length_sigma"], cfg.rollout.max_new_tokens)
    learn = profile["learn_s"] + profile["other_s"]
    costs = StepCosts(
        engine=dec,
        capacity=getattr(cfg.rollout.engine, "max_batch_size", 256),
        train_s=lambda trajectories: learn,
        gather_s=profile["publish_s"],
        send_s=0.0,
        recv_s=profile["weights_in_s"],
        checkpoint_s=0.0,
        reward_s_per_traj=profile["reward_s_per_traj"],
        static_batch=True,
    )
    return costs, lengths


def load_profile(path: Path) -> dict:
    return json.loads(Path(path).read_text())


def simulate(cfg, sim: SimSettings, design: Design, costs: StepCosts, lengths: LengthModel, *, steps: int, warmup: int):
    """Run the simulated node for warmup + steps steps; (the run, its summary)."""
    from stare.app.sim.node import SimNode
    from stare.app.sim.report import summarize

    node = SimNode(
        cfg,
        design,
        costs,
        lengths,
        prompt_len=int(sim.get("sim.prompt_tokens")),
        solve_beta=(float(sim.get("sim.solve_a")), float(sim.get("sim.solve_b"))),
    )
    run = node.run(steps + warmup + 1)
    return run, summarize(run, warmup)


def _publish_from(cfg, sim: SimSettings, on_gpu: bool) -> str:
    """system.weight_sync_publish_from as the learner resolves it (stare.weight_sync.factory.publish_from):
    auto is device where the broadcast sends over NCCL."""
    value = _read(cfg, sim, "system.weight_sync_publish_from")
    if value != "auto":
        return str(value)
    from stare.weight_sync.factory import publish_from

    return publish_from(cfg, cuda=on_gpu)
