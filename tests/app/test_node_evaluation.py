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


# ---------------------------------------------------------------- the EVALUATE op's parts, ranks in one process
class RecordingLearner:
    """A learner rank's weights for its engine (the seam `weights_for_local_engine`): the engine's own, each
    call recorded."""

    def __init__(self, engine):
        self.engine, self.calls = engine, []

    def weights_for_local_engine(self, keep: bool = True):
        self.calls.append(keep)
        return {k: v.clone() for k, v in self.engine.model.state_dict().items()} if keep else None


def _cfg(tiny_model_dir, **task):
    from stare.config import build_config

    return build_config(
        {
            "model": {"path": str(tiny_model_dir)},
            "rollout": {"max_new_tokens": 10},
            "task": {"eval_problems": 5, "eval_k": 2, "final_eval_k": 3, **task},
            "logging": {"eval_generations": 2},
        }
    )


def _ranks(cfg, tiny_model_dir, world: int):
    """Every rank's rollout side as RankEvaluation sees it (real engine, Colocation and board, one engine each)."""
    from types import SimpleNamespace

    from learner.process.sample_progress import LocalBoard
    from rollout.stack import RolloutStack
    from stare.app.colocation.node_evaluation import RankEvaluation
    from stare.app.colocation.one_gpu import Colocation
    from stare.models.resolve import load_run_setup

    setup = load_run_setup(cfg, lambda _: None, tiny_model_dir)
    ranks = []
    for rank in range(world):
        engine = HFEngine(str(tiny_model_dir))
        engine.sleep()  # as the colocated node leaves it before its learner steps
        r = SimpleNamespace(
            cfg=cfg,
            stack=RolloutStack(setup, engine, None),
            engine=engine,
            learner=RecordingLearner(HFEngine(str(tiny_model_dir))),
            colocation=Colocation(engine, lambda: None),
            board=LocalBoard(),
            rank=rank,
            collective=False,
        )
        r.evaluate_part = RankEvaluation(r, world)
        ranks.append(r)
    return ranks, setup


class RankOps:
    """The rank channel's `run_op` with the ranks in one process: rank 0's part, then each other rank's."""

    def __init__(self, ranks):
        self.ranks = ranks

    def run_op(self, op, args, local):
        return [local(), *(r.evaluate_part(*args) for r in self.ranks[1:])]


@pytest.mark.parametrize("final", [False, True])
def test_three_ranks_evaluate_what_one_engine_does_final_or_not(tiny_model_dir, final):
    """5 problems over 3 ranks (2, 2, 1), a second sampling setting for the task's data source, and the
    final evaluation's own k: NodeEvaluator's result is the in-process evaluator's on one engine."""
    from reward.scorers import build_scorer, scorer_judge
    from rollout.stack import RolloutStack, StackEvaluator
    from stare.app.colocation.node_evaluation import NodeEvaluator

    cfg = _cfg(tiny_model_dir, eval_sources={"stare/arithmetic": {"n": 3, "top_p": 0.9}})
    ranks, setup = _ranks(cfg, tiny_model_dir, 3)
    judge = scorer_judge(build_scorer(cfg, setup.task))
    node = NodeEvaluator(RankOps(ranks), ranks[0], ranks[0].evaluate_part, judge, cfg.logging.eval_generations)
    got = node(1, final=final)
    one = RolloutStack(setup, HFEngine(str(tiny_model_dir)), None)  # one engine, awake, evaluating every problem
    want = StackEvaluator(one, cfg, judge=judge)(0, dict, final=final)
    assert got == want and got["k"] == (3 if final else 2) and len(got["generations"]) == 2
    assert [r.evaluate_part.sampled for r in ranks] == [2, 2, 1]
    assert all(r.engine.asleep and r.engine.weight_version == 1 for r in ranks)  # woken, loaded, asleep again


def test_a_rank_without_a_share_neither_loads_weights_nor_wakes(tiny_model_dir):
    cfg = _cfg(tiny_model_dir, eval_problems=2)
    ranks, _ = _ranks(cfg, tiny_model_dir, 3)
    idle = ranks[2]
    assert idle.evaluate_part(1, False, idle.evaluate_part.digest) == []
    assert idle.learner.calls == [] and idle.colocation.events["wakes"] == 0 and idle.engine.weight_version == 0
    ranks[0].evaluate_part(1, False, ranks[0].evaluate_part.digest)
    assert ranks[0].learner.calls == [True] and ranks[0].colocation.events["wakes"] == 1


def test_a_rank_whose_problems_are_not_rank_0s_refuses_the_op(tiny_model_dir):
    ranks, _ = _ranks(_cfg(tiny_model_dir), tiny_model_dir, 2)
    with pytest.raises(RuntimeError, match=r"learner rank 1: its held-out problems \(5, digest \w+\) are not rank 0's"):
        ranks[1].evaluate_part(1, False, "0123456789ab")
