"""Seeding and the RNG states a checkpoint keeps (python, numpy, torch CPU), so a resumed run
samples as an uninterrupted one would."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch

from stare.config import TrainConfig
from stare.runtime.threads import apply_threads


def rng_state() -> dict[str, Any]:
    return {
        "python": random.getstate(),
        "numpy": np.random.get_state()[1].tolist(),
        "torch": torch.get_rng_state().tolist(),
    }


def set_rng_state(state: dict[str, Any]) -> None:
    py = state["python"]
    random.setstate((py[0], tuple(py[1]), py[2]))
    np_state = np.random.get_state()
    np.random.set_state((np_state[0], np.asarray(state["numpy"], dtype=np_state[1].dtype), *np_state[2:]))
    torch.set_rng_state(torch.tensor(state["torch"], dtype=torch.uint8))


def seed_everything(cfg: TrainConfig) -> None:
    apply_threads(cfg)  # run.threads, at most the CPUs this process may use
    random.seed(cfg.run.seed)
    np.random.seed(cfg.run.seed)
    torch.manual_seed(cfg.run.seed)
