"""A reward function of the user's own in the scoring processes (real processes): a hang is killed at
reward.scoring.timeout_s, an allocation fails at memory_mb, a slow import is not charged to the first
response; each scores that response 0 with the reason and the next ones score normally."""

from __future__ import annotations

import time

import pytest

from reward.scorers import PoolScorer, build_scorer
from reward.verifiers.compose import RewardInput
from stare.config import build_config

SOURCE = """
import time

time.sleep(IMPORT_S)  # a slow import (a model, a big table): paid at the process's start, not by a response


def compute_score(data_source, solution_str, ground_truth, extra_info):
    if data_source == "hangs":
        time.sleep(3600)  # a C-level wait: no in-thread timeout can stop it
    if data_source == "allocates":
        hog = bytearray(8 << 30)  # 8 GiB, past the address-space limit
        return float(len(hog))
    return float(solution_str == ground_truth)
"""


@pytest.fixture
def reward_file(tmp_path):
    def write(import_s: float = 0.0) -> str:
        path = tmp_path / f"slow_{str(import_s).replace('.', '_')}.py"
        path.write_text(SOURCE.replace("IMPORT_S", repr(import_s)))
        return str(path)

    return write


def _cfg(path: str, **scoring):
    reward = {"components": [{"kind": "function", "path": path}], "scoring": {"workers": 1, **scoring}}
    return build_config({"reward": reward})


def _x(source: str, text: str = "7") -> RewardInput:
    return RewardInput(response=text, answer="7", data_source=source, response_tokens=1)


def _score(cfg, inputs):
    from stare.data.tasks.registry import build_task

    scorer = build_scorer(cfg, build_task("arithmetic"))
    assert isinstance(scorer, PoolScorer)  # a function of the user's own always scores in the processes
    try:
        return scorer.score(inputs), scorer.pool.restarts
    finally:
        scorer.close()


@pytest.mark.slow
def test_a_hanging_function_is_killed_at_the_time_limit_and_the_next_response_scores(reward_file):
    t0 = time.monotonic()
    (hung, right), restarts = _score(_cfg(reward_file(), timeout_s=1.0), [_x("hangs"), _x("gsm8k")])
    assert (hung.reward, hung.error) == (0.0, "scoring process: timed out after 1 s")
    assert (right.reward, right.error, restarts) == (1.0, None, 1)
    assert time.monotonic() - t0 < 30  # the hang cost its limit, not an hour


@pytest.mark.slow
def test_an_allocation_past_the_memory_limit_scores_zero(reward_file):
    (hog, right), _ = _score(_cfg(reward_file(), memory_mb=1024), [_x("allocates"), _x("gsm8k")])
    assert hog.reward == 0.0 and hog.error.startswith("compute_score: MemoryError")
    assert (right.reward, right.error) == (1.0, None)


@pytest.mark.slow
def test_a_slow_import_is_not_charged_to_the_first_response(reward_file):
    # the module sleeps 2 s when imported; each response may take 1 s: the process imports it before it
    # says it is ready, so the first response is scored, not killed
    (first,), restarts = _score(_cfg(reward_file(import_s=2.0), timeout_s=1.0), [_x("gsm8k")])
    assert (first.reward, first.error, restarts) == (1.0, None, 0)
