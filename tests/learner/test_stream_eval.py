"""Evaluation through the streams (real redis-server; rollout and reward workers in threads, each
with its own Redis connection) gives the same numbers as the in-process evaluator for the same
weights and seeds, per data source; a restarted learner collects what it had published without
counting a sample twice, also one a stop request ended its wait for; a sample dead-lettered on the way
counts as incorrect, with its reason; a wait for samples nobody produces ends at the timeout, saying so."""

from __future__ import annotations

import logging
import threading
import time

import pytest
import torch
from redis_fixtures import have_redis_server, redis_server

from learner.loop.session_seams import EvaluationStopped
from learner.loop.stream_evaluator import StreamEvaluator
from reward.worker import RewardWorker
from rollout.evaluation import EvalSampler
from rollout.stack import StackEvaluator, build_rollout_stack
from rollout.worker import RolloutWorker
from stare.config import build_config
from stare.evaluation.streams import RedisEvalIndex, connect_eval_streams
from stare.transport.redis_client import connect_client
from stare.weight_sync.in_memory import MemoryWeightBoard

pytestmark = [pytest.mark.redis, pytest.mark.skipif(not have_redis_server(), reason="needs redis-server on PATH")]

COMPARED = (
    "greedy_accuracy",
    "pass_at_k",
    "avg_at_k",
    "k",
    "problems",
    "per_level",
    "per_source",
    "pass_at_k_per_source",
    "avg_at_k_per_source",
)


def _config(model_dir, tmp_path):
    return build_config(
        {
            "run": {"name": "ev", "output_dir": str(tmp_path / "runs"), "threads": 1},
            "model": {"path": str(model_dir)},
            "task": {"eval_problems": 6, "eval_k": 2, "eval_sources": {"stare/arithmetic": {"n": 3, "top_p": 0.9}}},
            "rollout": {"max_new_tokens": 12},
            "system": {"rollout_batch_prompts": 2},  # other batches than the in-process evaluator's single call
        }
    )


class ParityScored:
    """The arithmetic task's problems, a response "correct" when its characters' code points sum to an
    even number: about half the samples of even an untrained model, so the numbers differ whenever the
    samples do (the tiny test model solves nothing)."""

    def __init__(self, task):
        self.task, self.name = task, task.name

    def problems(self, *args, **kwargs):
        return self.task.problems(*args, **kwargs)

    def extract_answer(self, completion):
        return self.task.extract_answer(completion)

    def reward(self, problem, completion):
        return float(sum(map(ord, completion)) % 2 == 0)


def _stack(cfg):
    stack = build_rollout_stack(cfg, logging.getLogger("test").info)
    stack.setup.task = ParityScored(stack.setup.task)
    return stack


def _version_1(stack) -> dict[str, torch.Tensor]:
    """Weights other than the model file's: what the learner would publish after a step."""
    gen = torch.Generator().manual_seed(1)
    return {
        k: v + 0.02 * torch.randn(v.shape, generator=gen) if v.is_floating_point() else v
        for k, v in stack.engine.model.state_dict().items()
    }


class Workers:
    """An EvalSampler and a reward worker over the run's eval streams, each in its own thread."""

    def __init__(self, cfg, url: str, board: MemoryWeightBoard):
        self.cfg, self.url, self.board = cfg, url, board
        self.stop = threading.Event()
        self.stack = _stack(cfg)
        self.threads = [threading.Thread(target=self._rollout), threading.Thread(target=self._reward)]

    def __enter__(self):
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        for t in self.threads:
            t.join(timeout=60)
        self.stack.close()

    def _rollout(self):
        client = connect_client(self.url)
        evals, s = connect_eval_streams(self.cfg, client), self.stack.setup
        worker = RolloutWorker(
            self.stack.engine,
            s.tokenizer,
            evals.tasks,
            evals.raw,
            self.board,
            name="rollout-0",
            max_new_tokens=12,
            temperature=1.0,
            top_p=1.0,
            stop_token_ids=s.stop_ids,
            should_stop=self.stop.is_set,
        )
        sampler = EvalSampler(worker, evals.tasks, evals.raw, is_open=RedisEvalIndex(client, "ev").is_open)
        while not self.stop.is_set():
            sampler.run_once(2, block_s=0.2)
        client.close()

    def _reward(self):
        client = connect_client(self.url)
        evals = connect_eval_streams(self.cfg, client)
        worker = RewardWorker(
            self.stack.setup.task, evals.raw, evals.scored, name="reward-0", reward_config=None
        )  # the task's own verifier: ParityScored
        while not self.stop.is_set():
            worker.run_once(64, block_s=0.2)
        client.close()


def _evaluator(cfg, url: str, stack, **kw) -> StreamEvaluator:
    client = connect_client(url)
    return StreamEvaluator(
        cfg,
        stack.setup.task,
        stack.setup.tokenizer,
        connect_eval_streams(cfg, client),
        RedisEvalIndex(client, cfg.run.name),
        **kw,
    )


def test_stream_evaluation_equals_the_in_process_one_for_the_same_weights(tiny_model_dir, tmp_path):
    cfg = _config(tiny_model_dir, tmp_path)
    local = _stack(cfg)
    weights = _version_1(local)
    expected = StackEvaluator(local, cfg)(1, lambda: weights)
    board = MemoryWeightBoard()
    with redis_server(tmp_path / "redis") as server, Workers(cfg, server.url, board):
        board.publish(1, weights)  # the version under evaluation: workers wait for it
        ticks = []
        got = _evaluator(cfg, server.url, local, tick=lambda **info: ticks.append(info))(1)
    local.close()
    assert {k: got[k] for k in COMPARED} == {k: expected[k] for k in COMPARED}
    # the kept sample generations (logging.eval_generations per source): the same texts and scores both ways
    assert got["generations"] == expected["generations"] and len(got["generations"]) == 4  # one data source
    assert got["per_source"]["stare/arithmetic"]["n"] == 3 and got["problems"] == 6
    assert 0 < got["avg_at_k"] < 1 and 0 < got["greedy_accuracy"] < 1, got  # the comparison can tell results apart
    assert got["complete"] and got["missing_samples"] == 0 and got["weight_versions"] == [1]
    assert ticks and ticks[-1]["of"] == 6 * (1 + 3)


def test_a_restarted_learner_collects_its_published_evaluation_once(tiny_model_dir, tmp_path):
    cfg = _config(tiny_model_dir, tmp_path)
    local = _stack(cfg)
    expected = StackEvaluator(local, cfg)(0, dict)
    board = MemoryWeightBoard()
    with redis_server(tmp_path / "redis") as server:
        dead = _evaluator(cfg, server.url, local)
        tasks = dead.tasks(0)
        dead.streams.tasks.publish(tasks)  # what the killed learner did before it died ...
        dead.index.publish(tasks[0].eval_id, {"tasks": len(tasks)})
        with Workers(cfg, server.url, board):
            while dead.streams.scored.backlog() < 6 * 4:  # ... then it read part of the scores and died
                threading.Event().wait(0.1)
        held = dead.streams.scored.consume("learner", 10)
        dead.streams.scored.publish([d.record for d in held[:3]])  # and a redelivery duplicates some
        restarted = _evaluator(cfg, server.url, local, timeout_s=60)
        got = restarted(0)
        backlog = restarted.streams.scored.backlog()
    local.close()
    assert {k: got[k] for k in COMPARED} == {k: expected[k] for k in COMPARED}
    assert got["complete"] and backlog == 0  # everything it read is acknowledged


def test_a_stop_ends_the_wait_at_once_and_leaves_the_evaluation_for_the_restarted_learner(tiny_model_dir, tmp_path):
    cfg = _config(tiny_model_dir, tmp_path)
    local = _stack(cfg)
    expected = StackEvaluator(local, cfg)(0, dict)
    stop = threading.Event()
    with redis_server(tmp_path / "redis") as server:
        stopping = _evaluator(cfg, server.url, local, timeout_s=600, stop=stop.is_set)
        threading.Timer(0.5, stop.set).start()
        t0 = time.monotonic()
        with pytest.raises(EvaluationStopped, match="0 of 24 samples in"):
            stopping(0)  # nobody samples yet: without the stop it would wait its 600 s
        waited, state = time.monotonic() - t0, stopping.index.published("v0")["state"]
        with Workers(cfg, server.url, MemoryWeightBoard()):  # the workers come back with the next learner
            got = _evaluator(cfg, server.url, local, timeout_s=60)(0)
    local.close()
    assert waited < 5 and state == "open"
    assert {k: got[k] for k in COMPARED} == {k: expected[k] for k in COMPARED} and got["complete"]


def test_abandoning_closes_every_open_evaluation_so_workers_skip_its_tasks(tiny_model_dir, tmp_path):
    cfg = _config(tiny_model_dir, tmp_path)
    local = _stack(cfg)
    said: list[str] = []
    with redis_server(tmp_path / "redis") as server:
        evaluator = _evaluator(cfg, server.url, local, say=said.append)
        for eval_id in ("v3", "v4"):
            evaluator.index.publish(eval_id, {"tasks": 12})
        evaluator.index.close("v3", "done")
        evaluator.abandon_open()
        states = {e: evaluator.index.published(e)["state"] for e in ("v3", "v4")}
        still_open = evaluator.index.is_open("v4")
    local.close()
    assert states == {"v3": "done", "v4": "superseded"} and not still_open  # EvalSampler's check
    assert said == ["evaluation v4: left open by an earlier learner; closed (workers skip its tasks)"]


def test_a_wait_for_samples_nobody_produces_ends_at_the_timeout_and_says_what_is_missing(tiny_model_dir, tmp_path):
    cfg = _config(tiny_model_dir, tmp_path)
    local = _stack(cfg)
    said: list[str] = []
    with redis_server(tmp_path / "redis") as server:
        index = RedisEvalIndex(connect_client(server.url), "ev")
        index.publish("v7", {"tasks": 12})  # left open by a learner killed while it waited
        got = _evaluator(cfg, server.url, local, timeout_s=1.0, say=said.append)(0)
        states = {e: index.published(e)["state"] for e in ("v0", "v7")}
    local.close()
    assert not got["complete"] and got["missing_samples"] == 6 * 4 and got["greedy_accuracy"] == 0.0
    assert states == {"v0": "timed out", "v7": "superseded"}  # workers skip the tasks of both
    assert any("24 of 24 samples missing" in s and "tasks 12 not sampled" in s for s in said), said


def test_samples_dead_lettered_on_the_way_count_as_incorrect_with_their_reason_and_nothing_waits(
    tiny_model_dir, tmp_path
):
    # 128 positions - 121 new tokens leave room for 7-token prompts: the rollout worker parks the
    # longer held-out prompts (4 to 9 tokens here) in the eval_prompts dead-letter stream
    cfg = build_config(
        {**_config(tiny_model_dir, tmp_path).model_dump(mode="json"), "rollout": {"max_new_tokens": 121}}
    )
    local = _stack(cfg)
    board = MemoryWeightBoard()
    with redis_server(tmp_path / "redis") as server, Workers(cfg, server.url, board):
        evaluator = _evaluator(cfg, server.url, local, timeout_s=120)
        long_ones = sum(len(p) > 7 for p in evaluator.prompts)
        got = evaluator(0)
    local.close()
    assert 0 < long_ones < 6, "the held-out prompts must straddle the limit"
    assert got["missing_samples"] == 0 and got["dead_lettered_samples"] == long_ones * (1 + 3)
    assert not got["complete"] and all("over the limit of 7" in r for r in got["dead_letter_reasons"])
