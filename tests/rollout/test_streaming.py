"""The rollout worker's streaming loop (rollout/streaming.py).

- Over the transformers engine (its StreamingEngine adapter samples everything queued in one call)
  the streaming loop publishes the batch loop's trajectories, however the prompts are grouped.
- With an engine whose prompts finish at known steps (`ScriptedEngine`, a test double of the
  StreamingEngine protocol): a finished group's slot is refilled before the longest group ends,
  never more sequences than `capacity()` are in flight, each group is published as soon as it ends,
  evaluation tasks share the engine, and a new weight version is taken only once the engine has
  drained (records carry the version they were sampled with).
- Crash safety on a real redis-server: a worker that dies mid-stream leaves its unacknowledged
  prompts pending; its successor samples them and every group is published.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from redis_fixtures import have_redis_server, redis_server

from rollout.engines.base import Completion, SamplingParams, StreamingEngine, derive_seed, prompt_seed
from rollout.evaluation import EvalSampler
from rollout.streaming import StreamingLoop, streaming_enabled
from rollout.worker import RolloutWorker
from stare.transport.in_memory import MemoryStream, MemoryTransport
from stare.transport.records import EvalTask, PromptTask, Trajectory
from stare.weight_sync.in_memory import MemoryWeightBoard

MAX_NEW = 10


def _task(i: int, prompt: list[int], group_size: int = 4, min_version: int = 0) -> PromptTask:
    return PromptTask(
        run_id="r",
        group_id=f"g{i}",
        prompt="",
        prompt_token_ids=prompt,
        answer="1",
        problem_id=f"p{i}",
        data_source="stare/arithmetic",
        group_size=group_size,
        min_weight_version=min_version,
    )


def _worker(engine, tokenizer, transport, board, **kw) -> RolloutWorker:
    return RolloutWorker(
        engine,
        tokenizer,
        transport.prompts,
        transport.raw,
        board,
        name="rollout-0",
        max_new_tokens=MAX_NEW,
        temperature=1.0,
        top_p=1.0,
        stop_token_ids=(),
        seed=7,
        **kw,
    )


def _published(stream) -> dict[str, Trajectory]:
    out = {}
    while deliveries := stream.consume("reader", 1000):
        out.update((d.record.trajectory_id, d.record) for d in deliveries)
    return out


@pytest.fixture(scope="module")
def hf_stack(tiny_model_dir):
    from transformers import AutoTokenizer

    from rollout.engines.hf_engine import HFEngine

    torch.set_num_threads(1)
    return HFEngine(str(tiny_model_dir), max_batch_size=12), AutoTokenizer.from_pretrained(tiny_model_dir)


def test_the_hf_engine_streams(hf_stack):
    assert isinstance(hf_stack[0], StreamingEngine)


def test_streaming_over_the_hf_engine_publishes_the_batch_loops_trajectories(hf_stack):
    engine, tokenizer = hf_stack
    prompts = [
        tokenizer.encode(f"{a}+{b}=", add_special_tokens=False)
        for a, b in [(1, 2), (13, 4), (7, 77), (2, 5), (40, 41), (9, 9), (123, 4)]
    ]
    batch, stream = MemoryTransport(), MemoryTransport()
    for t in (batch, stream):
        t.prompts.publish([_task(i, p) for i, p in enumerate(prompts)])
    board = MemoryWeightBoard()
    batch_worker = _worker(engine, tokenizer, batch, board)
    while batch_worker.run_once(max_prompts=2):  # batches of 2 prompts
        pass
    loop = StreamingLoop(_worker(engine, tokenizer, stream, board), engine)  # capacity 12 rows: 3 prompts a step
    steps = 0
    while stream.prompts.backlog():
        loop.run_once()
        steps += 1
    assert steps == 3  # ceil(7 / 3) engine steps, each sampling what was queued
    want, got = _published(batch.raw), _published(stream.raw)
    assert sorted(got) == sorted(want) and len(got) == 7 * 4
    for tid, w in want.items():
        g = got[tid]
        assert np.array_equal(g.response_token_ids, w.response_token_ids), tid
        np.testing.assert_allclose(g.response_logprobs, w.response_logprobs, atol=1e-5, rtol=0)
        assert (g.weight_version, g.finish_reason, g.response_text) == (
            w.weight_version,
            w.finish_reason,
            w.response_text,
        )


class ScriptedEngine:
    """A StreamingEngine whose prompt `[k, i]` finishes exactly k steps after it was added (`[k, i, d]`:
    its sample j after k + j x d steps, so a group's samples end at different steps); each completion
    is `[k, sample index]` padded to one token per step it ran, log-probs -1. Records when each
    prompt went in and came out (by prompt), with which weights and seed, and checks the protocol's
    rules: never more than `capacity()` samples in flight (one prompt alone may exceed it), weights
    changed only with nothing pending unless `inflight_updates` (then each completion says from which
    token on each version sampled it)."""

    def __init__(self, capacity: int, inflight_updates: bool = False):
        self._capacity, self.weight_version = capacity, 0
        self.inflight_updates = inflight_updates
        self.clock = 0  # steps taken
        # key -> (sample end steps, params, prompt, the step it went in, [(step, version) runs])
        self.running: dict[object, tuple[list[int], SamplingParams, tuple, int, list]] = {}
        self.added: dict[tuple, int] = {}  # prompt -> steps taken when it was added
        self.finished: dict[tuple, int] = {}  # prompt -> the step that returned it
        self.versions: dict[tuple, int] = {}  # prompt -> weights it was added with
        self.seeds: dict[tuple, int | None] = {}

    def capacity(self) -> int:
        return self._capacity

    def add(self, prompt, params, key):
        p = tuple(prompt)
        per_sample = prompt[2] if len(prompt) > 2 else 0
        ends = [self.clock + prompt[0] + j * per_sample for j in range(params.n)]
        self.running[key] = (ends, params, p, self.clock, [(self.clock, self.weight_version)])
        self.added[p], self.versions[p], self.seeds[p] = self.clock, self.weight_version, prompt_seed(params)

    def sequences(self) -> int:
        return sum(sum(end > self.clock for end in ends) for ends, _, _, _, _ in self.running.values())

    def step(self):
        seqs = self.sequences()
        assert seqs <= self._capacity or len(self.running) == 1, f"{seqs} sequences in flight"
        self.clock += 1
        out = []
        for key in [k for k, (ends, _, _, _, _) in self.running.items() if max(ends) <= self.clock]:
            ends, params, p, start, runs = self.running.pop(key)
            self.finished[p] = self.clock
            group = []
            for j, end in enumerate(ends):
                n = max(end - start, 2)
                versions = [(step - start, v) for step, v in runs if step - start < n]
                group.append(Completion([p[0], j] + [0] * (n - 2), [-1.0] * n, "length", versions=versions))
            out.append((key, group))
        return out

    def pending(self):
        return len(self.running)

    def update_weights(self, state_dict, version):
        assert self.inflight_updates or not self.running, "weights changed with sequences in flight"
        self.weight_version = version
        for _, _, _, _, runs in self.running.values():
            runs.append((self.clock, version))

    def generate(self, prompts, params):
        raise AssertionError("the streaming loop never calls generate")

    def close(self):
        pass


class Decoder:
    """The tokenizer's two calls the worker makes, over the scripted engine's made-up ids."""

    def batch_decode(self, seqs, skip_special_tokens=True):
        return [" ".join(map(str, s)) for s in seqs]

    def decode(self, ids, skip_special_tokens=True):
        return " ".join(map(str, ids))


def _rounds(loop, until, limit=50) -> int:
    for i in range(limit):
        if until():
            return i
        loop.run_once()
    raise AssertionError(f"not done after {limit} rounds")


def _in_order(stream) -> list[Trajectory]:
    return [d.record for d in stream.consume("reader", 1000)]


def test_a_finished_groups_slot_is_refilled_before_the_longest_group_ends():
    engine, transport = ScriptedEngine(capacity=4), MemoryTransport()  # 4 sequences: 2 groups of 2
    durations = [6, 1, 1, 2, 1]  # steps each prompt runs; prompt i is [durations[i], i]
    transport.prompts.publish([_task(i, [k, i], group_size=2) for i, k in enumerate(durations)])
    loop = StreamingLoop(_worker(engine, Decoder(), transport, MemoryWeightBoard()), engine)
    _rounds(loop, lambda: not transport.prompts.backlog())
    # By hand: P0 and P1 go in at step 0; P1 ends at 1 and P2 takes its slot; P2 ends at 2 -> P3
    # (2 steps) ends at 4 -> P4 ends at 5; P0 ends at 6. A batch loop would start P2 only at 6.
    assert engine.added == {(6, 0): 0, (1, 1): 0, (1, 2): 1, (2, 3): 2, (1, 4): 4}
    assert engine.finished == {(1, 1): 1, (1, 2): 2, (2, 3): 4, (1, 4): 5, (6, 0): 6}
    order = [r.group_id for r in _in_order(transport.raw)]
    assert order == ["g1", "g1", "g2", "g2", "g3", "g3", "g4", "g4", "g0", "g0"]  # each group as it ends, whole


def test_evaluation_tasks_share_the_engine_without_stalling_training():
    engine, transport = ScriptedEngine(capacity=5), MemoryTransport()
    evals = MemoryTransport()  # its prompts/raw streams stand for eval_prompts/eval_raw
    transport.prompts.publish([_task(i, [1, i], group_size=2) for i in range(4)])
    evals.prompts.publish(
        [
            EvalTask(
                run_id="r",
                eval_id="e1",
                task_id="e1/0/sampled",
                prompt_token_ids=[4, 100],
                answer="1",
                problem_id="q",
                data_source="stare/arithmetic",
                level=0,
                n=3,
                temperature=1.0,
                top_p=1.0,
                max_new_tokens=MAX_NEW,
                seed=99,
                min_weight_version=0,
            )
        ]
    )
    worker = _worker(engine, Decoder(), transport, MemoryWeightBoard())
    sampler = EvalSampler(worker, evals.prompts, evals.raw)
    loop = StreamingLoop(worker, engine, sampler)
    _rounds(loop, lambda: not transport.prompts.backlog() and not evals.prompts.backlog())
    # the evaluation (3 sequences, 4 steps) goes in first; one training group of 2 beside it each step
    assert engine.added[(4, 100)] == 0
    assert [engine.added[(1, i)] for i in range(4)] == [0, 1, 2, 3]
    assert engine.seeds[(4, 100)] == 99
    assert engine.seeds[(1, 0)] == derive_seed(7, "g0")  # the batch loop's seed of group g0 (run seed 7)
    got = _in_order(evals.raw)
    assert [r.trajectory_id for r in got] == ["e1/0/sampled:0", "e1/0/sampled:1", "e1/0/sampled:2"]
    assert sampler.sampled == 1 and len(_in_order(transport.raw)) == 8


def test_a_new_weight_version_waits_until_the_engine_has_drained():
    engine, transport, board = ScriptedEngine(capacity=8), MemoryTransport(), MemoryWeightBoard()
    transport.prompts.publish([_task(0, [3, 0], group_size=2), _task(1, [1, 1], group_size=2, min_version=1)])
    loop = StreamingLoop(_worker(engine, Decoder(), transport, board), engine)
    loop.run_once()  # P0 goes in with version 0; P1 needs version 1: it waits
    board.publish(1, {})
    _rounds(loop, lambda: not transport.prompts.backlog())
    # P1 goes in only when P0 (3 steps) has ended and the engine has taken version 1 (the scripted
    # engine refuses an update with anything in flight), though the room was there all along
    assert engine.added == {(3, 0): 0, (1, 1): 3} and engine.finished[(3, 0)] == 3
    assert engine.versions == {(3, 0): 0, (1, 1): 1}
    assert {r.group_id: r.weight_version for r in _in_order(transport.raw)} == {"g0": 0, "g1": 1}


def test_an_ended_sample_frees_its_room_while_its_groups_others_still_run():
    engine, transport = ScriptedEngine(capacity=5), MemoryTransport()
    # P0's samples end after 1 and 6 steps, P1's both after 3, P2's after 1 (groups of 2)
    transport.prompts.publish(
        [_task(0, [1, 0, 5], group_size=2), _task(1, [3, 1], group_size=2), _task(2, [1, 2], group_size=2)]
    )
    loop = StreamingLoop(_worker(engine, Decoder(), transport, MemoryWeightBoard()), engine)
    _rounds(loop, lambda: not transport.prompts.backlog())
    # step 0: P0 + P1 = 4 samples, P2's 2 more do not fit 5; after step 1 P0's first sample has ended:
    # 3 + 2 fit, so P2 goes in at 1 (counting whole groups it would wait for P1's end at 3)
    assert engine.added == {(1, 0, 5): 0, (3, 1): 0, (1, 2): 1}
    assert engine.finished == {(1, 2): 2, (3, 1): 3, (1, 0, 5): 6}


def test_in_flight_the_engine_takes_a_new_version_between_steps_and_records_say_which_tokens_it_sampled():
    engine, transport, board = ScriptedEngine(capacity=8, inflight_updates=True), MemoryTransport(), MemoryWeightBoard()
    transport.prompts.publish([_task(0, [4, 0], group_size=2), _task(1, [1, 1], group_size=2, min_version=1)])
    loop = StreamingLoop(_worker(engine, Decoder(), transport, board), engine, inflight=True)
    loop.run_once()  # P0 goes in with version 0 and steps; P1 needs version 1, not yet published: it waits
    loop.run_once()  # no drain and no wait for the learner: P0 steps on
    assert engine.clock == 2 and engine.added == {(4, 0): 0}
    board.publish(1, {})
    _rounds(loop, lambda: not transport.prompts.backlog())
    # version 1 taken before step 3 with P0 in flight (2 of its 4 tokens sampled); P1 in at once
    assert engine.added == {(4, 0): 0, (1, 1): 2} and engine.versions == {(4, 0): 0, (1, 1): 1}
    records = {r.trajectory_id: r for r in _in_order(transport.raw)}
    p0 = records["g0:0"]
    assert (p0.weight_version, p0.version_starts, p0.newest_version) == (0, [[2, 1]], 1)
    assert p0.token_versions().tolist() == [0, 0, 1, 1]
    assert (records["g1:0"].weight_version, records["g1:0"].version_starts) == (1, [])


def test_in_flight_weight_updates_need_an_engine_that_takes_them():
    engine = ScriptedEngine(capacity=4)  # inflight_updates False
    worker = _worker(engine, Decoder(), MemoryTransport(), MemoryWeightBoard())
    with pytest.raises(ValueError, match="inflight_weight_updates"):
        StreamingLoop(worker, engine, inflight=True)


def test_a_full_downstream_stream_holds_finished_groups_and_admits_nothing_until_they_are_out():
    engine = ScriptedEngine(capacity=4)
    transport = MemoryTransport(raw=MemoryStream("raw", maxlen=5))  # unacknowledged records: 2 groups of 2 fit, not 3
    transport.prompts.publish([_task(i, [1, i], group_size=2) for i in range(4)])
    loop = StreamingLoop(_worker(engine, Decoder(), transport, MemoryWeightBoard()), engine)
    loop.run_once()  # P0 and P1 end at step 1: published
    with pytest.raises(OverflowError):
        loop.run_once()  # P2 and P3 end at step 2: 4 more records do not fit
    with pytest.raises(OverflowError):
        loop.run_once()  # still full: neither stepped nor topped up
    assert engine.clock == 2 and transport.prompts.backlog() == 2  # P2, P3 sampled, not acknowledged
    reward = transport.raw.consume("reward", 10)
    assert sorted(d.record.group_id for d in reward) == ["g0", "g0", "g1", "g1"]  # nothing half-published
    transport.raw.ack([d.id for d in reward])  # the reward worker made room
    loop.run_once()
    assert transport.prompts.backlog() == 0 and engine.clock == 2
    assert sorted(d.record.group_id for d in transport.raw.consume("reward", 10)) == ["g2", "g2", "g3", "g3"]


def test_the_vllm_engine_streams_by_default_and_hf_keeps_its_batch_loop():
    from stare.config import build_config

    engine = ScriptedEngine(capacity=4)
    assert streaming_enabled(build_config({"rollout": {"engine": "vllm"}}), engine)
    assert not streaming_enabled(build_config({}), engine)
    assert streaming_enabled(build_config({"system": {"rollout_streaming": True}}), engine)
    assert not streaming_enabled(build_config({"rollout": {"engine": "vllm", "tool_use": {"enabled": True}}}), engine)
    with pytest.raises(ValueError, match="rollout_streaming"):
        streaming_enabled(build_config({"rollout": {"engine": "vllm"}}), object())


@pytest.mark.redis
@pytest.mark.skipif(not have_redis_server(), reason="needs redis-server on PATH")
@pytest.mark.parametrize("successor", ["restart", "other-worker"])
def test_a_worker_that_dies_mid_stream_leaves_its_unpublished_prompts_to_its_successor(tmp_path, successor):
    from stare.transport.redis_transport import RedisTransport

    durations = [6, 1, 1, 2, 1]
    with redis_server(tmp_path / "redis") as server:
        first = RedisTransport.connect(server.url, "r", block_ms=100, claim_idle_ms=60_000)
        first.prompts.publish([_task(i, [k, i], group_size=2) for i, k in enumerate(durations)])
        dead = ScriptedEngine(capacity=4)
        loop = StreamingLoop(_worker(dead, Decoder(), first, MemoryWeightBoard()), dead)
        for _ in range(3):  # P1 and P2 published (steps 1, 2), P0 and P3 in the engine: then the process dies
            loop.run_once()
        first.close()

        second = RedisTransport.connect(server.url, "r", block_ms=100, claim_idle_ms=60_000)
        engine = ScriptedEngine(capacity=4)
        name = "rollout-0" if successor == "restart" else "rollout-1"
        worker = _worker(engine, Decoder(), second, MemoryWeightBoard())
        worker.name = name
        loop = StreamingLoop(worker, engine)
        if successor == "other-worker":  # what `stare rollout` does every claim_idle_s / 2
            loop.offer("train", second.prompts.reclaim(name, min_idle_ms=0))
        _rounds(loop, lambda: not second.prompts.backlog())
        published = [r.group_id for r in _in_order(second.raw)]
        second.close()
    assert sorted(published) == sorted(f"g{i}" for i in range(5) for _ in range(2))  # each group once, whole
    assert set(dead.finished) == {(1, 1), (1, 2)}
    assert {p for _, _, p, _, _ in dead.running.values()} == {(6, 0), (2, 3)}
    assert set(engine.added) == {(6, 0), (2, 3), (1, 4)}  # what the dead worker held, sampled again, and the rest


def test_capacity_reserves_max_model_len_until_the_warm_up_then_the_mean_sample_with_headroom():
    from rollout.engines.base import CAPACITY_WARMUP_SAMPLES, KV_HEADROOM, SampleLengths, streaming_capacity

    seen = SampleLengths()
    for _ in range(CAPACITY_WARMUP_SAMPLES - 1):
        seen.add(1000)
    assert seen.reserve(4096) == 4096.0 and streaming_capacity(409_600, 256, seen.reserve(4096)) == 100
    seen.add(1000)  # the 64th: the mean (1,000) x 1.2 from now on
    assert seen.reserve(4096) == 1000 * KV_HEADROOM == 1200.0
    assert streaming_capacity(409_600, 256, seen.reserve(4096)) == 256  # 341 by the cache, max_num_seqs caps it
    assert streaming_capacity(240_000, 256, seen.reserve(4096)) == 200
    assert SampleLengths(count=100, total=100 * 5000).reserve(4096) == 4096.0  # never past max_model_len


@pytest.mark.parametrize(
    "overrides, positions, want",
    [
        ({}, 4096, 1024 + 3072),  # the run's prompt + response
        ({}, 131072, 1024 + 3072),  # not a long-context model's 131k: a handful of samples would fill the KV cache
        ({}, 2048, 2048),  # within the model's positions
        ({"rollout": {"tool_use": {"enabled": True}}}, 131072, None),  # the tool loop's turns grow the context
        ({"data": {"max_prompt_len": None}}, 4096, None),  # no prompt limit: the model's own
    ],
)
def test_a_vllm_engine_gets_the_runs_context_as_max_model_len(overrides, positions, want):
    from rollout.stack import run_max_model_len
    from stare.config import build_config

    base = {"data": {"max_prompt_len": 1024}, "rollout": {"max_new_tokens": 3072}}
    for k, v in overrides.items():
        base[k] = {**base.get(k, {}), **v}
    assert run_max_model_len(build_config(base), positions) == want


class CountingStream:
    """A stream that records how many entries each consume asks for."""

    def __init__(self, inner):
        self.inner, self.asked = inner, []

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def consume(self, consumer, max_count, block_s=0.0):
        self.asked.append(max_count)
        return self.inner.consume(consumer, max_count, block_s)


def test_before_it_knows_a_streams_group_size_a_worker_asks_for_one_prompt_then_for_the_room():
    engine, transport = ScriptedEngine(capacity=8), MemoryTransport()
    transport.prompts.publish([_task(i, [5, i], group_size=2) for i in range(6)])
    transport.prompts = counting = CountingStream(transport.prompts)
    loop = StreamingLoop(_worker(engine, Decoder(), transport, MemoryWeightBoard()), engine)
    loop.run_once()
    # one prompt (n unknown: room // 1 would hold 8 prompts, 4 of them pending here while another worker idles),
    # then (8 - 2) // 2 = 3 once it knows n = 2: 4 prompts, 8 samples, the capacity
    assert counting.asked[:2] == [1, 3] and len(engine.added) == 4
