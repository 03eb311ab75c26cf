"""The closed-loop entropy controller: the gate and the adaptive W/M schedule.

Small on purpose (like verl's AdaptiveKLController). The trainer calls `begin_step(h_gate, h)` once
per step before the loss (the gate, and under `order: reference` W and M updated from this step's
entropy, as the reference implementation does) and `end_step(h)` after the optimizer step (the W/M
update under `order: lagged`). `decide` and `update` are the two halves. A non-finite entropy skips
the step's controller work and keeps gate, W and M (the reference's guard; `skipped` says so, the
trainer logs it as `controller_skipped`). `set_target` changes the target and band between steps
(the control plane calls it); `state_dict` / `load_state_dict` make a restarted run continue
exactly. Host floats: called at the step boundary, never inside the loss.
"""

from __future__ import annotations

import logging
import math
from typing import Any

from pydantic import ValidationError

from stare.config.algo import ControllerConfig, check_entropy_range, merge_config

log = logging.getLogger(__name__)


def _sign(x: float) -> float:
    return 0.0 if x == 0 else math.copysign(1.0, x)


def fit_entropy_range(cfg: ControllerConfig, max_entropy: float | None) -> ControllerConfig:
    """The run's starting config with target and band lowered to `max_entropy` (logged): a target above
    ln V means "always below target", which ln V itself says (no distribution exceeds it), and the
    published config must validate against ln V so later changes and checkpoint loads can."""
    if max_entropy is None:
        return cfg
    update: dict[str, Any] = {}
    if cfg.target > max_entropy:
        update["target"] = max_entropy
    if cfg.band is not None and cfg.band[1] > max_entropy:
        update["band"] = (min(cfg.band[0], max_entropy), max_entropy)
    if update:
        log.warning(
            "controller: %s above ln V = %.4g (the largest entropy over this model's vocabulary); using %s",
            {k: getattr(cfg, k) for k in update},
            max_entropy,
            update,
        )
        return ControllerConfig.model_validate({**cfg.model_dump(), **update})
    return cfg


class EntropyController:
    """`max_entropy`: ln V of the model (the learner passes it). The starting config's target and band
    are lowered to it (`fit_entropy_range`); changes (`reconfigure`) and checkpoints
    (`load_state_dict`) above it are refused."""

    def __init__(self, cfg: ControllerConfig, max_entropy: float | None = None):
        self.max_entropy = max_entropy
        self.cfg = cfg = fit_entropy_range(cfg, max_entropy)
        self.target = cfg.target
        self.band: tuple[float, float] | None = cfg.band
        self.w = cfg.w
        self.m = cfg.m
        self.gate = False
        self.last_entropy: float | None = None
        self.smoothed: float | None = None  # the EMA of the entropy the W/M schedule reads (cfg.ema)
        self.skipped = False  # this step's entropy was not finite: gate, W and M kept

    def set_target(self, target: float, band: tuple[float, float] | None = None) -> None:
        """New target (and band, or none) from the next decision on; validated like the config."""
        self.reconfigure(target=target, band=band)

    def reconfigure(self, **changes: Any) -> None:
        """Change any config field (target, band, adaptive, alpha, bounds, W, M) between steps.

        Validated as a whole; on error nothing changes. W and M, when given, replace the current
        values; otherwise the current values are clipped into the new bounds."""
        self.cfg = merge_config({**self.cfg.model_dump(), "w": self.w, "m": self.m}, changes, self.max_entropy)
        self.target, self.band, self.w, self.m = self.cfg.target, self.cfg.band, self.cfg.w, self.cfg.m

    def begin_step(self, gate_entropy: float, entropy: float) -> bool:
        """Before step k's loss: under `order: reference`, W and M from `entropy` (H_k), then the gate
        from `gate_entropy`; under `order: lagged`, the gate only. A non-finite input skips all of it."""
        self.skipped = not (math.isfinite(gate_entropy) and math.isfinite(entropy))
        if self.skipped:
            log.warning(
                "controller: non-finite batch entropy (gate input %s, entropy %s); gate, W and M kept",
                gate_entropy,
                entropy,
            )
            return self.gate
        if self.cfg.order == "reference":
            self.update(entropy)
        return self.decide(gate_entropy)

    def end_step(self, entropy: float) -> None:
        """After the optimizer step: the W/M update under `order: lagged` (unless the step was skipped)."""
        if self.cfg.order == "lagged" and not self.skipped:
            self.update(entropy)

    def decide(self, entropy: float) -> bool:
        """Gate for this step: entropy below target, or the band's hysteresis. Non-finite: kept."""
        if not math.isfinite(entropy):
            return self.gate
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
        """After the step, W and M for the next one.

        sign: W <- clip(W + a sgn(tgt - H), 1, W_max); M <- clip(M - a sgn(tgt - H), M_min, 1).
        proportional: u = clip(gain (tgt - H), 0, 1); W = 1 + u (W_max - 1); M = 1 - u (1 - M_min).
        """
        if not self.cfg.adaptive or not math.isfinite(entropy):
            return
        ema = self.cfg.ema
        self.smoothed = entropy if self.smoothed is None else ema * self.smoothed + (1.0 - ema) * entropy
        entropy = self.smoothed if ema > 0.0 else entropy
        if self.cfg.schedule == "proportional":
            u = min(max(self.cfg.gain * (self.target - entropy), 0.0), 1.0)
            # clipped: 1 - 1 * (1 - 0.1) is 0.0999... in floats, which the config would refuse
            self.w = min(1.0 + u * (self.cfg.w_max - 1.0), self.cfg.w_max)
            self.m = max(1.0 - u * (1.0 - self.cfg.m_min), self.cfg.m_min)
        else:
            step = self.cfg.alpha * _sign(self.target - entropy)
            self.w = min(max(self.w + step, 1.0), self.cfg.w_max)
            self.m = min(max(self.m - step, self.cfg.m_min), 1.0)
        self.cfg = self.cfg.model_copy(update={"w": self.w, "m": self.m})

    def state_dict(self) -> dict[str, Any]:
        """The config as changed at run time, the current W and M, the gate and the last entropy."""
        config = self.cfg.model_dump(mode="json")
        config.update(w=self.w, m=self.m)
        return {
            "config": config,
            "gate": self.gate,
            "last_entropy": self.last_entropy,
            "max_entropy": self.max_entropy,
            "smoothed": self.smoothed,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Validated like a change (bounds, finiteness, ln V): a checkpoint holding values outside the
        ranges is refused (ValueError naming the field) instead of training on them."""
        config = dict(state["config"])
        if isinstance(config.get("band"), list):
            config["band"] = tuple(config["band"])
        try:
            self.cfg = check_entropy_range(ControllerConfig.model_validate(config), self.max_entropy)
        except ValidationError as err:
            raise ValueError(f"the checkpoint's controller state is invalid: {err}") from None
        self.target, self.band, self.w, self.m = self.cfg.target, self.cfg.band, self.cfg.w, self.cfg.m
        self.gate = bool(state["gate"])
        self.last_entropy = state["last_entropy"]
        smoothed = state.get("smoothed")  # absent in checkpoints before session 5
        if smoothed is not None and not math.isfinite(smoothed):
            raise ValueError(f"the checkpoint's controller state is invalid: smoothed={smoothed} is not finite")
        self.smoothed = smoothed
