"""The held-out evaluation's cost in `stare sim`: one evaluation simulated on the node's engines, charged to
every step as a share (as checkpoints are).

What the product does (learner/loop/stream_evaluator.py, rollout/evaluation.py): every `task.eval_every`
steps the learner publishes the evaluation's tasks, a greedy one and a sampled one of `n` samples per
held-out problem (stare.evaluation.heldout.eval_tasks), and trains no further until every sample is scored;
the rollout workers sample evaluation tasks before training prompts. The session writes no checkpoint for an
evaluation (one due at its step, `run.checkpoint_every`, is written before the wait: charged as every checkpoint). A node-colocated learner of several ranks
spreads it over every rank's engine (the EVALUATE op, stare/app/colocation/node_evaluation.py: each wakes,
takes its learner's weights, gathered on every rank under ZeRO-3, samples problems r, r + ranks, ... and sleeps);
one rank evaluates on its own engine, woken for it.

What this models: the evaluation's problems split over the engines that sample it, each engine starting empty
(`SimEngine.generate`) and running the greedy pass, then the sampled one (each to its longest response), responses from the run's length model scaled by `sim.eval_length_factor`; the
evaluation lasts until the slowest engine ends; the learner waits for all of it. Not modelled: training
sequences already in an engine when the evaluation starts (they go on beside it: the estimate is low by
their share of the engines' memory bandwidth).
"""

from __future__ import annotations

from stare.app.sim.engine import SimEngine
from stare.app.sim.lanes import Lane


def evaluation_samples(cfg) -> tuple[int, int]:
    """(held-out problems, samples per problem: one greedy + the sampled task's n) of one evaluation."""
    from stare.evaluation.heldout import eval_settings

    s = eval_settings(cfg)
    n = max([s["k"], *(src.n for src in s["per_source"].values())])
    return int(cfg.task.eval_problems), 1 + int(n)


def evaluation_s(cfg, design, costs, lengths, *, prompt_len: int, factor: float, seed: int = 0) -> float:
    """Seconds one evaluation keeps the learner waiting on this node (0 when the run does not evaluate)."""
    from rollout.engines.base import SamplingParams

    problems, per = evaluation_samples(cfg)
    if problems <= 0 or cfg.task.eval_every <= 0:
        return 0.0
    engines = max((design.gpus if design.colocated else design.gpus - design.learner_gpus) // design.rollout_tp, 1)
    eval_lengths = lengths.scaled(factor)
    # the greedy pass, then the sampled one: each a generate call that ends with its longest response
    # (rollout/evaluation.py sample_problems; a rollout worker's EvalSampler likewise, one call per setting)
    passes = [
        SamplingParams(n=1, max_new_tokens=cfg.rollout.max_new_tokens, temperature=0.0),
        SamplingParams(n=per - 1, max_new_tokens=cfg.rollout.max_new_tokens, temperature=1.0),
    ]
    ends = []
    for i in range(engines):
        share = len(range(i, problems, engines))
        if not share:
            continue
        lane = Lane(f"eval-{i}", [])
        engine = SimEngine(lane, costs.engine, eval_lengths, capacity=costs.capacity, kv=costs.kv, seed=seed * 7919 + i)
        for params in passes:
            engine.generate([[1] * prompt_len for _ in range(share)], params)
        ends.append(lane.now)
    # colocated: every engine woken for it and put back to sleep, its weights gathered first under ZeRO-3
    wake = costs.swap_s + _gather_s(cfg, design, costs) if design.colocated else 0.0
    return max(ends, default=0.0) + wake


def _gather_s(cfg, design, costs) -> float:
    """The EVALUATE op's ZeRO-3 gather of the weights (every rank takes part) in a node-colocated learner."""
    nc = costs.engine
    if cfg.optim.zero_stage != 3 or design.gpus <= 1:
        return 0.0
    return nc.allgather_s(nc.model.weight_bytes, design.gpus)
