"""No silent bad runs (stare/observe/watch.py): each warning fires when its condition holds, says what to do, is
kept as a metric, and does not repeat every step; the kept generations are the same problems every evaluation."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from stare.config import build_config
from stare.data.tasks.base import Problem
from stare.evaluation.heldout import generation_picks
from stare.observe.watch import WARN_EVERY, RunWatch


def _traj(group: str, reward: float, prompt=(3, 4, 5), response=(6, 7)):
    return SimpleNamespace(
        group_id=group,
        reward=reward,
        prompt_token_ids=np.asarray(prompt, np.int32),
        response_token_ids=np.asarray(response, np.int32),
    )


def _watch(**logging):
    said: list[str] = []
    cfg = build_config({"logging": logging})
    return RunWatch(cfg.logging, unk_id=2, say=said.append), said


def test_equal_rewards_in_every_group_warn_at_the_start_of_the_streak_and_every_tenth_step():
    watch, said = _watch()
    mixed = [_traj("a", 1.0), _traj("a", 0.0), _traj("b", 1.0), _traj("b", 1.0)]
    assert watch.step(1, mixed)["equal_reward_groups"] == 1 and said == []  # one group still learns
    flat = [_traj("a", 1.0), _traj("a", 1.0), _traj("b", 0.0), _traj("b", 0.0)]
    for step in range(2, 2 + 2 * WARN_EVERY):
        assert watch.step(step, flat)["equal_reward_groups"] == 2
    assert len(said) == 2  # steps 2 and 12: the streak's start, then a reminder
    assert said[0].startswith("warning: step 2: every group's rewards are equal (2 groups)")
    assert "data.dynamic_sampling" in said[0] and "10 steps in a row" not in said[0]
    assert said[1].startswith("warning: step 12:") and "11 steps in a row" in said[1]


def test_zero_reward_for_n_steps_warns_once_at_n_then_every_n():
    watch, said = _watch(warn_zero_reward_steps=3)
    zero = [_traj("a", 0.0), _traj("a", 0.0)]
    streaks = [watch.step(s, zero)["zero_reward_steps"] for s in range(1, 8)]
    assert streaks == [1, 2, 3, 4, 5, 6, 7]
    zero_lines = [s for s in said if "reward has been 0" in s]
    assert len(zero_lines) == 2 and "for 3 steps" in zero_lines[0] and "for 6 steps" in zero_lines[1]
    assert "generations.jsonl" in zero_lines[0]
    assert watch.step(8, [_traj("a", 1.0), _traj("a", 0.0)])["zero_reward_steps"] == 0  # a reward resets it
    off, said_off = _watch(warn_zero_reward_steps=0)
    for s in range(1, 30):
        off.step(s, zero)
    assert not any("reward has been 0" in s for s in said_off)


def test_unknown_tokens_in_responses_are_measured_and_warned_about_once():
    watch, said = _watch(warn_unk_rate=0.25)
    clean = watch.step(1, [_traj("a", 1.0), _traj("a", 0.0)])
    assert clean["unk_rate_prompt"] == 0.0 and clean["unk_rate_response"] == 0.0 and said == []
    unk = [_traj("a", 1.0, response=(2, 2, 6, 7)), _traj("a", 0.0, prompt=(2, 4, 5, 6))]
    metrics = watch.step(2, unk)
    # prompts: 1 unknown of 3 + 4 = 7 tokens; responses: 2 of 2 + 4 = 6
    assert metrics["unk_rate_prompt"] == 1 / 7 and metrics["unk_rate_response"] == 2 / 6
    (line,) = said
    assert line.startswith("warning: step 2: 33% of the response tokens are the tokenizer's unknown token '<unk>'")
    watch.step(3, unk)
    assert len(said) == 1  # once a run
    no_unk = RunWatch(build_config({}).logging, unk_id=None, say=said.append).step(1, unk)
    assert "unk_rate_prompt" not in no_unk  # a tokenizer without an unknown token: no such metric


def test_the_kept_generations_are_the_same_problems_every_time_per_source():
    problems = [
        Problem(prompt=f"q{i}", answer="1", problem_id=f"{src}-{i}", level=1, data_source=src)
        for src, n in (("aime24", 30), ("aime25", 30), ("math", 2))
        for i in range(n)
    ]
    picks = generation_picks(problems, 4)
    assert picks == generation_picks(list(problems), 4)  # fixed: every evaluation shows the same problems
    by_source = [problems[i].data_source for i in picks]
    assert by_source.count("aime24") == 4 and by_source.count("aime25") == 4 and by_source.count("math") == 2
    assert picks != sorted(range(4)) and generation_picks(problems, 0) == []  # a seeded choice, not the first ones
