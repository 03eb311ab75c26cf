"""Where one embedded step's time goes: rollout, reward, learn, publish (a breakdown, no target).

Runs `stare train`'s loop (stare.app.launch.embedded.EmbeddedRun, the tiny config unless overridden) and
times its pieces as they are called, by wrapping them on the run's objects (the real calls
happen, nothing is replaced):
  * rollout:       `RolloutWorker.run_once` less its weight load (sampling, records);
  * weights in:    `RolloutWorker.sync_weights` (the engine takes the newest weights);
  * reward:        `RewardWorker.run_once` (verifying every sampled response);
  * learn:         `Learner.train_step` (pre-pass, plan, micro-batches, optimizer step, metrics);
  * publish:       `Learner.state_dict_for_rollout` + the weight board's `publish`;
  * other:         the rest of the step (collecting groups, metrics, logs).
Shares are of the wall time between the ends of the measured steps: the first step (it includes
the held-out evaluation at step 0) and the last (the final evaluation) are left out. Each row:
ours = seconds per step in that piece, baseline = seconds per step in all, ratio = the share;
spread = the share's min-max over the measured steps.

Usage: `stare bench step` (quick: `--quick`).
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable
from typing import Any

from stare.app.bench.common import row

QUICK = dict(steps=12)
FULL = dict(steps=32)
PHASES = ("rollout", "weights in", "reward", "learn", "publish")


def _timer(totals: dict[str, float], phase: str, fn: Callable) -> Callable:
    def timed_call(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            totals[phase] += time.perf_counter() - t0

    return timed_call


def measure(*, steps: int, overrides: list[str] = ()) -> list[dict[str, Any]]:
    """One row per piece of the step (and `other`), shares of the measured steps' wall time."""
    from stare.app.bench.common import tiny_config
    from stare.app.launch.embedded import EmbeddedRun, StopFlag

    if steps < 3:
        raise ValueError(f"steps={steps}: the first and last steps are not measured, so at least 3 are needed")
    with tempfile.TemporaryDirectory(prefix="stare-bench-step-") as tmp:
        cfg = tiny_config(
            [
                f"run.output_dir={tmp}",
                "run.name=bench-step",
                f"run.steps={steps}",
                f"run.checkpoint_every={steps + 1}",
                f"task.eval_every={steps + 1}",
                "task.eval_problems=8",
                "control_plane.serve_in_train=false",
                *overrides,
            ]
        )
        run = EmbeddedRun(cfg, resume=False, log=lambda s: None)
        totals = dict.fromkeys(PHASES, 0.0)
        run.rollout.sync_weights = _timer(totals, "weights in", run.rollout.sync_weights)
        run.rollout.run_once = _timer(totals, "rollout", run.rollout.run_once)
        run.reward.run_once = _timer(totals, "reward", run.reward.run_once)
        run.learner.train_step = _timer(totals, "learn", run.learner.train_step)
        run.learner.state_dict_for_rollout = _timer(totals, "publish", run.learner.state_dict_for_rollout)
        run.board.publish = _timer(totals, "publish", run.board.publish)
        marks: list[tuple[float, dict[str, float]]] = []
        try:
            run.train(StopFlag(), on_step=lambda m: marks.append((time.perf_counter(), dict(totals))))
        finally:
            run.close()
    if len(marks) != steps:
        raise RuntimeError(f"the run logged {len(marks)} of {steps} steps (no group with a reward signal?)")
    kept = marks[: steps - 1]  # ends of steps 1 .. N-1: intervals are steps 2 .. N-1

    def pieces(a: tuple, b: tuple) -> dict[str, float]:
        out = {p: b[1][p] - a[1][p] for p in PHASES}
        out["rollout"] -= out["weights in"]  # sync_weights runs inside run_once
        out["other"] = (b[0] - a[0]) - sum(out.values())
        return out

    per_step = [(b[0] - a[0], pieces(a, b)) for a, b in zip(kept, kept[1:])]
    n = len(per_step)
    total = kept[-1][0] - kept[0][0]
    whole = pieces(kept[0], kept[-1])
    r = cfg.rollout
    rows = []
    for p in (*PHASES, "other"):
        shares = [parts[p] / wall for wall, parts in per_step]
        rows.append(
            row(
                f"step/{p}",
                f"share of an embedded step: {p} ({r.prompts_per_step} x {r.samples_per_prompt} "
                f"samples, {r.engine.name} engine, steps 2-{steps - 1})",
                ours=whole[p] / n,
                baseline=total / n,
                unit="s/step",
                higher_is_better=False,
                spread=[min(shares), max(shares)],
                repeats=n,
            )
        )
    return rows


def run(quick: bool) -> list[dict[str, Any]]:
    return measure(**(QUICK if quick else FULL))
