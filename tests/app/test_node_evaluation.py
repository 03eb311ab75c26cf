"""The node-colocated held-out evaluation spread over the ranks (stare/app/colocation/node_evaluation.py): any
split of the problems over engines samples and scores what one engine evaluating them all does, because each
problem samples from its own seed. Real transformers engine on the tiny model; the whole op with 2 ranks
(gloo, `stare up`) is tests/system/test_modes_agree.py's colocated case."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from rollout.engines.hf_engine import HFEngine
from rollout.evaluation import evaluate, sample_problems, score_samples
from stare.data.tasks.registry import build_task

SETTINGS = {"k": 3, "temperature": 1.0, "top_p": 1.0, "per_source": None}


@pytest.fixture(scope="module")
def parts(tiny_model_dir):
    engine, tokenizer = HFEngine(str(tiny_model_dir)), AutoTokenizer.from_pretrained(tiny_model_dir)
    task = build_task("arithmetic")
    problems = task.problems("test", 6, 0)
    return engine, tokenizer, task, problems


def _sample(parts, indices):
    engine, tokenizer, _, problems = parts
    return sample_problems(
        engine, tokenizer, problems, indices, max_new_tokens=10, stop_token_ids=(), seed=11, **SETTINGS
    )


def test_problems_split_over_two_engines_sample_the_same_responses_as_one(parts):
    whole = _sample(parts, range(6))
    split = _sample(parts, range(1, 6, 2)) + _sample(parts, range(0, 6, 2))  # rank 1's share arriving first
    assert sorted(split, key=lambda s: s.index) == whole
    assert len({tuple(map(tuple, s.token_ids[1:])) for s in whole}) > 1  # the samples differ between problems


def test_scored_shares_give_the_one_engine_evaluation(parts):
    engine, tokenizer, task, problems = parts
    want = evaluate(
        engine, tokenizer, task, problems, max_new_tokens=10, stop_token_ids=(), seed=11, generations=2, **SETTINGS
    )
    shares = _sample(parts, range(1, 6, 2)) + _sample(parts, range(0, 6, 2))
    assert score_samples(task, problems, shares, generations=2, **SETTINGS) == want


def test_a_problem_without_responses_is_refused_by_index(parts):
    _, _, task, problems = parts
    with pytest.raises(ValueError, match=r"held-out responses missing for problems \[1, 3, 5\] of 6"):
        score_samples(task, problems, _sample(parts, range(0, 6, 2)), **SETTINGS)
