"""The one place that builds the rollout stack of a run: tokenizer, task, stop ids, engine and (with
tool use) the tool agent; and the in-process evaluator of `stare train` (`stare learner` evaluates
through the streams on the rollout workers: learner/loop/stream_evaluator.py, same plan and numbers).

    stack = build_rollout_stack(cfg, log)              # the rollout worker's engine
    evaluate = StackEvaluator(stack, cfg)              # held-out evaluation on the same stack
    result = evaluate(version, learner.state_dict_for_rollout)
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from rollout.engines.base import RolloutEngine
from rollout.engines.registry import build_engine
from stare.config import TrainConfig
from stare.evaluation.heldout import Judge
from stare.models.resolve import RunSetup, load_run_setup


@dataclass
class RolloutStack:
    setup: RunSetup
    engine: RolloutEngine
    agent: Any | None  # a ToolAgent over `engine` when rollout.tool_use is on

    @property
    def sampler(self) -> Any:
        """What generates a response: the tool agent when there is one, else the engine."""
        return self.agent or self.engine

    def close(self) -> None:
        self.engine.close()


def engine_config(
    cfg: TrainConfig,
    model_path: Path,
    engine: str | None = None,
    *,
    sleep_mode: bool = False,
    external_launcher: bool = False,
) -> dict[str, Any]:
    """The rollout engine's config: the run's `rollout.engine` section (or the named engine's
    defaults) with the model and dtype (the engine config resolves the transformers engine's device auto).
    `sleep_mode`: vLLM built able to sleep (a colocated `stare train`; the transformers engine always can).
    `external_launcher`: vLLM joins this process's torch.distributed world (a rank of the node-colocated
    learner)."""
    from stare.config import ENGINE_SECTIONS

    section = cfg.rollout.engine
    if engine is not None and engine != section.name:
        section = ENGINE_SECTIONS[engine]()
    out: dict[str, Any] = {**section.model_dump(), "model_path": str(model_path), "dtype": cfg.model.dtype}
    if section.name == "vllm":
        out["seed"] = cfg.run.seed  # requests without a seed of their own (the rollout worker seeds each group)
        out["sleep_mode"] = sleep_mode
        out["inflight_updates"] = cfg.system.inflight_weight_updates
        out["external_launcher"] = external_launcher
        if out["max_model_len"] is None:
            out["max_model_len"] = run_max_model_len(cfg, model_positions(model_path))
    return out


def model_positions(model_path: Path) -> int | None:
    """max_position_embeddings of the model directory's config.json (None when it names none)."""
    import json

    config = json.loads((Path(model_path) / "config.json").read_text())
    positions = config.get("text_config", config).get("max_position_embeddings")
    return None if positions is None else int(positions)


def run_max_model_len(cfg: TrainConfig, positions: int | None) -> int | None:
    """The context a run's samples need: data.max_prompt_len + rollout.max_new_tokens, within the model's
    `positions`; None (the model's own limit) without a prompt limit or with the tool loop (its turns grow
    the context). vLLM sizes its batch to sequences of max_model_len tokens (and so does the streaming
    worker: `VLLMEngine.capacity`): left at a long-context model's 32k-131k positions, a run of 4k-token
    samples would decode a handful of sequences at a time."""
    if cfg.data.max_prompt_len is None or cfg.rollout.tool_use.enabled:
        return None
    need = cfg.data.max_prompt_len + cfg.rollout.max_new_tokens
    return need if positions is None else min(need, positions)


def build_rollout_stack(
    cfg: TrainConfig,
    log: Callable[[str], None],
    *,
    model_path: Path | None = None,
    engine: str | None = None,
    sleep_mode: bool = False,
    external_launcher: bool = False,
) -> RolloutStack:
    setup = load_run_setup(cfg, log, model_path)
    built = build_engine(
        engine_config(cfg, setup.model_path, engine, sleep_mode=sleep_mode, external_launcher=external_launcher)
    )
    agent = None
    if cfg.rollout.tool_use.enabled:
        from rollout.agent_loop import build_tool_agent

        agent = build_tool_agent(cfg.rollout.tool_use, built, setup.tokenizer)
    return RolloutStack(setup=setup, engine=built, agent=agent)


class StackEvaluator:
    """Held-out evaluation of the learner's newest weights on a rollout stack of this process: the
    problems, seeds and summary of stare.evaluation.heldout, the sampler of the stack (the tool agent when
    tool use is on)."""

    def __init__(
        self,
        stack: RolloutStack,
        cfg: TrainConfig,
        log: Callable[[str], None] | None = None,
        judge: Judge | None = None,
    ):
        """`judge` scores the responses (None: the task's own verifier; `stare train` passes its reward
        scorer, so its evaluation scores as the reward workers score a distributed run's)."""
        from stare.data.feeder import eval_problems

        self.stack, self.cfg, self.judge = stack, cfg, judge
        # the prompt length policy (data.max_prompt_len) applies to held-out prompts as to training ones
        self.problems = eval_problems(
            cfg,
            stack.setup.task,
            stack.setup.tokenizer,
            log or logging.getLogger(__name__).warning,
            max_model_len=getattr(stack.engine, "max_model_len", None),
        )

    def __call__(
        self, version: int, weights: Callable[[], Mapping[str, torch.Tensor]], final: bool = False
    ) -> dict[str, Any]:
        from rollout.evaluation import eval_settings, evaluate

        engine = self.stack.engine
        if engine.weight_version < version:  # evaluate what the learner has, not what rollout last took
            engine.update_weights(weights(), version)
        s = self.stack.setup
        return evaluate(
            self.stack.sampler,
            s.tokenizer,
            s.task,
            self.problems,
            stop_token_ids=s.stop_ids,
            judge=self.judge,
            version=version,
            generations=self.cfg.logging.eval_generations,
            **eval_settings(self.cfg, final=final),
        )

    def close(self) -> None:
        """Close the stack (for an evaluator that owns its stack, as the distributed learner's does)."""
        self.stack.close()
