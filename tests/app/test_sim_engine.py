"""`stare sim`'s stand-in engine: vLLM's KV cache as its scheduler runs it (admission, preemption and the
recompute of a preempted sequence), priced by a cost stub whose numbers are easy to add up by hand."""

from __future__ import annotations

import pytest

from rollout.engines.base import SamplingParams
from stare.app.sim.engine import SimEngine
from stare.app.sim.lanes import Lane
from stare.app.sim.parts import KvCache
from stare.app.sim.workload import LengthModel


class _Stub:
    """1 s a decode step whatever the batch, 1 ms a prefilled token."""

    def decode_span_s(self, steps, seqs, context_sum):
        return float(steps)

    def prefill_s(self, tokens):
        return tokens * 1e-3


def _run(kv_tokens: int) -> SimEngine:
    # two prompts of 10 tokens, one sample each, every response 20 tokens
    engine = SimEngine(
        Lane("e", [0]), _Stub(), LengthModel(20, 0.0, 100), capacity=8, seed=0, kv=KvCache(kv_tokens, 256, 4096)
    )
    params = SamplingParams(n=1, max_new_tokens=100)
    engine.generate([[1] * 10, [1] * 10], params)
    return engine


def test_a_full_cache_preempts_the_newest_sequence_and_recomputes_it():
    """KV for 50 tokens: both prompts fit (20 tokens); after 15 steps each holds 15 more (50: full), so the
    newest is preempted; the first ends 5 steps later, then the second is re-admitted: its prompt (its group no
    longer resident) and its 15 tokens prefilled again (25 ms), 5 steps more. 25 s of decode + 45 ms of
    prefill (20 at the start)."""
    engine = _run(50)
    assert engine.preemptions == 1
    assert engine.lane.now == pytest.approx(25 + 0.045)


def test_a_cache_that_holds_everything_never_preempts():
    engine = _run(10_000)
    assert engine.preemptions == 0
    assert engine.lane.now == pytest.approx(20 + 0.020)
