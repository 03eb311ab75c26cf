"""`SimLearner`: the learner's seam in `stare sim` on the learner lane (`train_step`, `prepare`, the weight
gather, checkpoint writes) with its real `EntropyController`."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from learner.step.prepass_store import PrepassStore
from stare.app.sim.lanes import Lane


class SimLearner:
    """The learner's seam on the learner lane: train_step, the weight gather, checkpoint writes.
    `colocated`: the learner shares the rollout engines' GPUs, so a step starts once every engine
    is idle (they sleep) and the engines wake after it."""

    def __init__(
        self,
        cfg,
        lane: Lane,
        step_s: Callable[[list], float],
        gather_s: float,
        checkpoint_s: float,
        *,
        wait_engines: Callable[[], float] | None = None,
        prepass_s: Callable[[list], float] | None = None,
    ):
        from learner.algorithm.entropy_controller import EntropyController

        self.cfg, self.lane = cfg, lane
        self.step_s, self.gather_s, self.checkpoint_s = step_s, gather_s, checkpoint_s
        self.wait_engines, self.prepass_s = wait_engines, prepass_s
        self.prepared = PrepassStore()  # the product's store: values by trajectory id at one weight version
        self.controller = EntropyController(cfg.controller, max_entropy=10.0)
        self.step = self.version = 0
        self.trained_tokens: list[tuple[float, int]] = []  # (end time, tokens) per step

    def train_step(self, trajectories: list) -> dict[str, Any]:
        if self.wait_engines is not None:
            self.lane.wait_until(self.wait_engines())
        kept = self.prepared.get(trajectories, self.version)  # as Learner.train_step asks its store
        self.prepared.clear()  # this step moves the weights: nothing kept is valid after it
        ahead = [t for t in trajectories if t.trajectory_id in kept]  # their pre-pass already ran
        saved = self.prepass_s(ahead) if ahead and self.prepass_s is not None else 0.0
        self.lane.busy(self.step_s(trajectories) - saved, "train")
        # tokens the step trains on: a response's tokens left out of the loss (older than max_staleness) do not count
        tokens = sum(len(t.prompt_token_ids) + int(np.count_nonzero(t.loss_mask)) for t in trajectories)
        self.trained_tokens.append((self.lane.now, tokens))
        self.step += 1
        self.version += 1
        c = self.controller
        return {
            "step": self.step,
            "weight_version": self.version,
            "loss": 0.0,
            "entropy": c.target,
            "gate": False,
            "w": c.w,
            "m": c.m,
            "target": c.target,
            "grad_norm": 0.0,
        }

    def prepare(self, trajectories: list) -> None:
        """The pre-pass ahead of a step (the session calls it while it waits for data): its time on the
        learner lane now, taken out of the step that trains these trajectories. Colocated it stays in the
        step: the GPUs are the engines' while they sample."""
        if self.prepass_s is None or self.wait_engines is not None or not trajectories:
            return
        self.lane.busy(self.prepass_s(trajectories), "train")
        # what Learner.prepare keeps: per trajectory its [k, response length] values at this version
        self.prepared.keep(
            {t.trajectory_id: torch.zeros(1, len(t.response_token_ids)) for t in trajectories}, self.version
        )

    def state_dict_for_rollout(self) -> dict:
        self.lane.busy(self.gather_s, "send/receive")
        return {}

    def save(self, directory: Path, extra: dict[str, Any]) -> str:
        self.lane.busy(self.checkpoint_s, "checkpoint")
        tag = f"step_{self.step:06d}"
        (directory / tag).mkdir(parents=True, exist_ok=True)
        (directory / tag / "sim.json").write_text(json.dumps({"step": self.step, "time_s": self.lane.now}))
        return tag

    def load(self, directory: Path, tag: str | None = None) -> dict[str, Any]:
        raise NotImplementedError("stare sim starts fresh runs only")
