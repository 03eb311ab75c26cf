"""The simulated node's parts: what it runs (Design) and what its stand-ins cost (StepCosts, KvCache)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from stare.app.sim.streams import TimedStream


@dataclass
class SimTransport:
    prompts: TimedStream
    raw: TimedStream
    scored: TimedStream

    def close(self) -> None:
        pass


@dataclass
class Design:
    """What the simulated node runs (the adapter in stare/app/sim/design.py reads it from a config)."""

    gpus: int
    learner_gpus: int
    rollout_tp: int
    colocated: bool
    streaming: bool
    inflight: bool
    publish_from: str  # host | device
    eager: bool
    max_staleness: int
    # colocated through the product's node (SamplePump, NodeRollout, its checks); False: a peer's colocated design
    # the product does not run (TP engines, validation only): engines asleep while the learner steps
    product_colocation: bool = True


@dataclass(frozen=True)
class KvCache:
    """A vLLM engine's KV cache as its streaming capacity sees it (VLLMEngine.capacity)."""

    tokens: int
    max_num_seqs: int
    max_model_len: int


@dataclass
class StepCosts:
    """The times the stand-ins take (from costs.NodeCosts or a measured CPU profile)."""

    engine: Any  # decode_span_s(steps, seqs, context_sum), prefill_s(tokens)
    capacity: int  # samples the streaming worker keeps in an engine (VLLMEngine.capacity: KV / max_model_len)
    train_s: Callable[[list], float]  # one optimizer step over these trajectories
    gather_s: float  # the learner's main thread preparing a publish
    send_s: float  # the learner sending (waited for only when the publish is synchronous)
    recv_s: float  # a rollout engine taking a version
    checkpoint_s: float
    swap_s: float = 0.0  # colocated: engine sleep + wake per step
    reward_s_per_traj: float = 0.0
    static_batch: bool = False  # the transformers engine decodes a call's rows until its longest ends
    running: int = 0  # sequences the engine itself runs at once (vLLM's scheduler: KV / mean length); 0: capacity
    kv: KvCache | None = None  # vLLM's cache: capacity() grows with the finished samples' mean length; None: fixed
    prepass_s: Callable[[list], float] | None = None  # the pre-pass share of train_s (optim.prepass_early); None: off
    phases_s: Callable[[list], dict[str, float]] | None = None  # train_s by phase (train, prepass, zero3, ...)
    eval_s: float = 0.0  # one held-out evaluation, the learner waiting (stare/app/sim/evaluation.py)
