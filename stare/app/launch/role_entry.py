"""The entry point of each role process (`stare learner|rollout|reward`, `stare up`, the Ray
actors): an application, so it may wire one role's pieces into another's seams. The learner gets
its held-out evaluator here: the one through the streams, since its workers run in other processes;
node-colocated (`system.colocate: on`), every learner rank gets a rollout engine of its own instead
(stare/app/colocation/node.py) and rank 0 evaluates on its engine."""

from __future__ import annotations

from typing import Any

from stare.config import ConfigError, TrainConfig

ROLES = ("learner", "rollout", "reward")


def learner_evaluator(cfg: TrainConfig, setup, transport, tick, stop=lambda: False):
    """The distributed learner's evaluator: through the evaluation streams, sampled by the rollout
    workers and scored by the reward workers (learner/loop/stream_evaluator.py); the learner holds no second
    model and no sandbox. (`stare train` keeps its in-process `StackEvaluator`.)"""
    from learner.loop.stream_evaluator import StreamEvaluator
    from stare.evaluation.streams import RedisEvalIndex, connect_eval_streams

    return StreamEvaluator(
        cfg,
        setup.task,
        setup.tokenizer,
        connect_eval_streams(cfg, transport.client, transport.trust),
        RedisEvalIndex(transport.client, cfg.run.name),
        tick=tick,
        stop=stop,
    )


def _role_module(kind: str):
    """The role's module (`run(cfg, ...)`), imported only for the role this process runs."""
    if kind == "learner":
        from learner.process import role
    elif kind == "rollout":
        from rollout import role
    else:
        from reward import role
    return role


def run_role(kind: str, cfg: TrainConfig, *, redis_url: str, name: str, stop=None, **extra: Any) -> None:
    if kind not in ROLES:
        raise ValueError(f"unknown role {kind!r}; valid roles: {ROLES}")
    module = _role_module(kind)
    if kind == "learner":
        from stare.config.colocation import check_node_colocation, node_colocated

        extra["evaluator_factory"] = learner_evaluator
        if node_colocated(cfg):
            from stare.app.colocation.node import rank_rollout

            check_node_colocation(cfg)
            extra["rank_rollout"] = rank_rollout(cfg, redis_url, name)
    elif kind == "rollout":
        from stare.config.colocation import node_colocated

        if node_colocated(cfg):
            raise ConfigError(
                "system.colocate: on puts rollout inside the learner's ranks; a `stare rollout` worker "
                "has nothing to do there: do not start one, or set system.colocate=off"
            )
    module.run(cfg, redis_url=redis_url, name=name, stop=stop, **extra)
