"""The closed-loop entropy controller: the gate and the adaptive W/M schedule.

Small on purpose (like verl's AdaptiveKLController): `decide(entropy)` is called once per step with
the step's batch entropy and returns whether STARE reweights this step; `update(entropy)` runs
after the optimizer step and adapts W and M for the next one. `set_target` changes the target and
band between steps (the control plane calls it); `state_dict` / `load_state_dict` make a restarted
run continue exactly. Host floats: called at the step boundary, never inside the loss.
"""

from __future__ import annotations

import math
from typing import Any

from stare.learner.config import ControllerConfig


def _sign(x: float) -> float:
    return 0.0 if x == 0 else math.copysign(1.0, x)


class EntropyController:
    def __init__(self, cfg: ControllerConfig):
        self.cfg = cfg
        self.target = cfg.target
        self.band: tuple[float, float] | None = cfg.band
        self.w = cfg.w
        self.m = cfg.m
        self.gate = False
        self.last_entropy: float | None = None

    def set_target(self, target: float, band: tuple[float, float] | None = None) -> None:
        """New target (and band, or none) from the next decision on; validated like the config."""
        self.cfg = self.cfg.model_copy(update={"target": target, "band": band})
        ControllerConfig.model_validate(self.cfg.model_dump())
        self.target, self.band = target, band

    def decide(self, entropy: float) -> bool:
        """Gate for this step: entropy below target, or the band's hysteresis."""
        self.last_entropy = entropy
        if self.band is None:
            self.gate = entropy < self.target
        else:
            low, high = self.band
            if entropy < low:
                self.gate = True
            elif entropy > high:
                self.gate = False
        return self.gate

    def update(self, entropy: float) -> None:
        """After the step: W <- clip(W + a sgn(tgt - H), 1, W_max); M <- clip(M - a sgn(tgt - H), M_min, 1)."""
        if not self.cfg.adaptive:
            return
        step = self.cfg.alpha * _sign(self.target - entropy)
        self.w = min(max(self.w + step, 1.0), self.cfg.w_max)
        self.m = min(max(self.m - step, self.cfg.m_min), 1.0)

    def state_dict(self) -> dict[str, Any]:
        return {
            "target": self.target,
            "band": list(self.band) if self.band is not None else None,
            "w": self.w,
            "m": self.m,
            "gate": self.gate,
            "last_entropy": self.last_entropy,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        band = state["band"]
        self.set_target(state["target"], tuple(band) if band is not None else None)
        self.w, self.m = float(state["w"]), float(state["m"])
        self.gate = bool(state["gate"])
        self.last_entropy = state["last_entropy"]
