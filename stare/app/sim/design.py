"""The sim's config adapter: a run config (+ the node) -> what the simulated node runs and what its
work costs.

The design knobs are the run config's own fields (system.rollout_streaming, system.inflight_weight_updates,
system.weight_sync_publish_from, rollout.engine.enforce_eager, ...), set with `--set` as for any run.
Two are read with a default where the config has no such field (the adapter takes them out before the
config is validated):

| field | default | meaning |
| --- | --- | --- |
| `rollout.engine.enforce_eager` | the config's (None = auto: CUDA graphs on a GPU) | eager vs CUDA-graph decode (the hf section has none) |
| `sim.zero3_head` | per_micro_batch | per_chunk: the ZeRO-3 head gathered per chunk and recompute (before issue #24); per_micro_batch |

Response lengths: `sim.response_mean` tokens (default 1,050) and `sim.response_sigma` (0.6), capped at
`rollout.max_new_tokens`; prompts of `sim.prompt_tokens` tokens (default 200, +/- 25%); solve rates
Beta(`sim.solve_a`, `sim.solve_b`) (default 1, 1: uniform), which sets what dynamic sampling filters.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stare.app.sim.costs import GPUS, LengthModel, ModelCosts, NodeCosts
from stare.app.sim.node import Design, KvCache, StepCosts

NEW_FIELDS = {
    "rollout.engine.enforce_eager": None,  # the hf section has none: auto
}
SIM_FIELDS = {
    "sim.response_mean": 1050.0,
    "sim.response_sigma": 0.6,
    "sim.prompt_tokens": 200,
    "sim.solve_a": 1.0,
    "sim.solve_b": 1.0,
    "sim.zero3_head": "per_micro_batch",
    "sim.extra_forward": 0,
}


@dataclass
class SimSettings:
    knobs: dict[str, Any] = field(default_factory=dict)

    def get(self, key: str):
        return self.knobs.get(key, SIM_FIELDS.get(key, NEW_FIELDS.get(key)))


def split_overrides(cfg_path: Path | None, overrides: list[str]) -> tuple[list[str], SimSettings]:
    """(the overrides the config validates, the sim's own settings). A field of NEW_FIELDS stays an
    override when the config already has it (the lead merged it)."""
    from stare.config import TrainConfig, parse_override

    passed, knobs = [], {}
    for text in overrides:
        key, value = parse_override(text)
        if key in SIM_FIELDS or (key in NEW_FIELDS and not _config_has(TrainConfig, key)):
            knobs[key] = value
        else:
            passed.append(text)
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
    eng = cfg.rollout.engine
    eager = _read(cfg, sim, "rollout.engine.enforce_eager")
    if eager is None:  # auto: CUDA graphs where CUDA is present
        eager = not on_gpu
    head, allowed = sim.get("sim.zero3_head"), ("per_chunk", "per_micro_batch")
    if head not in allowed:
        raise ValueError(f"sim.zero3_head={head!r}: choose one of {', '.join(allowed)} (--set sim.zero3_head=...)")
    learner = learner_gpus if learner_gpus is not None else cfg.system.learner_ranks
    if colocated:
        learner = gpus
    return Design(
        gpus=gpus,
        learner_gpus=learner,
        rollout_tp=getattr(eng, "tensor_parallel_size", 1),
        colocated=colocated,
        streaming=_streaming(cfg, sim),
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
    return LengthModel(
        float(sim.get("sim.response_mean")), float(sim.get("sim.response_sigma")), cfg.rollout.max_new_tokens
    )


def gpu_costs(cfg, sim: SimSettings, design: Design, shape, gpu_name: str) -> StepCosts:
    """The stand-ins' times on `gpu_name` GPUs (costs.GPUS) for a model of `shape`."""
    if gpu_name not in GPUS:
        raise ValueError(f"--gpu {gpu_name}: unknown; choose one of {', '.join(GPUS)} (or cpu with --profile)")
    model = ModelCosts(shape)
    nc = NodeCosts(GPUS[gpu_name], model, tp=design.rollout_tp, eager=design.eager)
    eng, o, d = cfg.rollout.engine, cfg.optim, design
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
    # what vLLM's own scheduler runs of a blocking generate: blocks as sequences grow, so about the KV cache
    # over a mean sequence (its preemptions, rare at this fill, are not modelled)
    per_seq = float(sim.get("sim.prompt_tokens")) + lengths_of(cfg, sim).mean
    running = int(max(capacity, min(max_seqs, kv_tokens // per_seq)))
    zero3 = o.zero_stage == 3 and d.learner_gpus > 1
    per_micro = sim.get("sim.zero3_head") == "per_micro_batch"
    extra = int(sim.get("sim.extra_forward"))

    def train_s(trajectories: list) -> float:
        resp = sum(len(t.response_token_ids) for t in trajectories)
        tokens = resp + sum(len(t.prompt_token_ids) for t in trajectories)
        mean_len = tokens / max(len(trajectories), 1)
        per_rank = tokens / d.learner_gpus
        if per_micro:  # once per micro-batch of the pre-pass and of the training pass
            gathers = 2 * math.ceil(per_rank / (o.max_tokens_per_micro_batch or 8192))
        else:  # per log-prob chunk in the pre-pass, the forward and the recompute
            gathers = 3 * math.ceil(resp / d.learner_gpus / o.logits_chunk_tokens)
        return nc.train_s(
            tokens,
            mean_len,
            d.learner_gpus,
            recompute=o.gradient_checkpointing,
            zero3=zero3,
            head_gathers=gathers,
            extra_forward=extra,
        )

    def prepass_s(trajectories: list) -> float:
        """The share of `train_s` that a pre-pass ahead of the step (optim.prepass_early) takes out of it."""
        if not trajectories:
            return 0.0
        tokens = sum(len(t.prompt_token_ids) + len(t.response_token_ids) for t in trajectories)
        gathers = (
            math.ceil(tokens / d.learner_gpus / (o.max_tokens_per_micro_batch or 8192))
            if per_micro
            else math.ceil(
                sum(len(t.response_token_ids) for t in trajectories) / d.learner_gpus / o.logits_chunk_tokens
            )
        )
        return nc.prepass_s(tokens, tokens / len(trajectories), d.learner_gpus, zero3=zero3, head_gathers=gathers)

    if d.colocated:
        gather, send, recv = 0.0, nc.refit_colocated_s(), 0.0
    elif d.publish_from == "device":
        gather, send, recv = nc.publish_device_s(d.learner_gpus, zero3), nc.broadcast_s(), nc.broadcast_s()
    else:  # host: D2H on the main thread; H2D per bucket and the broadcast on the publisher's
        h2d = nc.pageable_copy_s()
        gather = nc.publish_host_s(d.learner_gpus, zero3) - h2d
        send = recv = h2d + nc.broadcast_s()
    return StepCosts(
        engine=nc,
        capacity=max(capacity, 1),
        running=running,
        kv=KvCache(int(kv_tokens), int(max_seqs), int(max_len)),
        train_s=train_s,
        prepass_s=prepass_s if o.prepass_early else None,
        gather_s=gather,
        send_s=send,
        recv_s=recv,
        checkpoint_s=nc.checkpoint_s(),
        swap_s=nc.sleep_wake_s() if d.colocated else 0.0,
    )


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


def _streaming(cfg, sim: SimSettings) -> bool:
    """system.rollout_streaming as the rollout worker resolves it (rollout/streaming.py): None is on for
    the vllm engine, off for hf."""
    value = _read(cfg, sim, "system.rollout_streaming")
    return getattr(cfg.rollout.engine, "name", "hf") == "vllm" if value is None else bool(value)


def _publish_from(cfg, sim: SimSettings, on_gpu: bool) -> str:
    """system.weight_sync_publish_from as the learner resolves it (stare.weight_sync.factory.publish_from):
    auto is device where the broadcast sends over NCCL."""
    value = _read(cfg, sim, "system.weight_sync_publish_from")
    if value != "auto":
        return str(value)
    from stare.weight_sync.factory import publish_from

    return publish_from(cfg, cuda=on_gpu)
