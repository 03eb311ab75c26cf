"""Steps per minute of the distributed system (`stare up`) with rollout and learning overlapped
(`system.max_staleness: 1`) vs synchronous (`max_staleness: 0`), on the tiny config.

Both arms run the same config (configs/tiny-cpu.yaml, the bundled tiny model, 1 rollout and
1 reward worker, no control plane) in this run, one after the other, alternating which goes first
over `--repeats`. Steps/min is 60 / the median step time by the learner's clock, over the steps
after `--warmup` (start-up and the first steps excluded; a median, so one slow step cannot move
it). Ratio = overlapped / synchronous (target >= 1.5).

The row also carries `stare sim`'s compute-only ideal of the ratio on this machine (`ideal`,
`of_ideal`; the costs measured right after the runs: docs/performance.md); the target stays 1.5.

Usage: python stare/app/bench/bench_overlap.py [--steps 40] [--warmup 5] [--repeats 1] [--rollout 1] [--reward 1] [--no-ideal]
(or `stare bench overlap`)
"""

from __future__ import annotations

import argparse
import io
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from stare.app.bench.common import format_table, median, paired_row

TARGET = 1.5
ARM_TIMEOUT_S = 900.0  # one `stare up` run, start to finish
SIM_TIMEOUT_S = 600.0  # one `stare sim` subprocess (the calibration runs bench step: minutes on a loaded machine)
QUICK = dict(steps=24, warmup=3, repeats=1)
FULL = dict(steps=40, warmup=5, repeats=2)


def run_arm(
    staleness: int, steps: int, rollout: int, reward: int, out: Path, extra: list[str], timeout_s: float = ARM_TIMEOUT_S
) -> list[float]:
    """Run `stare up` to `steps` steps; the learner's end-of-step clock readings (unix seconds)."""
    from stare.app.bench.common import tiny_config
    from stare.app.launch.processes import ProcessLauncher as Launcher

    overrides = [
        f"run.output_dir={out}",
        f"run.name=overlap-s{staleness}",
        f"run.steps={steps}",
        f"run.checkpoint_every={steps}",
        f"task.eval_every={10 * steps}",
        "task.eval_problems=8",
        f"system.max_staleness={staleness}",
        "control_plane.port=0",
        *extra,
    ]
    cfg = tiny_config(overrides)
    log = io.StringIO()
    launcher = Launcher(cfg, rollout=rollout, reward=reward, control=False, out=log, color=False)
    deadline = time.monotonic() + timeout_s
    try:
        launcher.start()
        code = launcher.supervise(until=lambda: time.monotonic() > deadline, poll_s=0.2)
    finally:
        launcher.stop()
    if time.monotonic() > deadline:
        print(log.getvalue()[-20000:], file=sys.stderr)  # every role's log lines, for the suite's error report
        raise TimeoutError(
            f"max_staleness={staleness}: stare up did not finish {steps} steps within {timeout_s:.0f}s "
            "(its log is above)"
        )
    if code != 0:
        print(log.getvalue()[-20000:], file=sys.stderr)  # every role's log lines, for the suite's error report
        raise RuntimeError(f"max_staleness={staleness}: stare up exited with {code} (its log is above)")
    metrics = [json.loads(line) for line in (cfg.run_dir / "metrics.jsonl").read_text().splitlines()]
    return [m["time_unix"] for m in metrics]


def steps_per_min(times: list[float], warmup: int) -> float:
    """60 / the median time between the ends of consecutive steps after `warmup` (a slow step, a
    GC pause or a scheduling hiccup on a shared machine, cannot move a median)."""
    if len(times) <= warmup:
        raise ValueError(f"{len(times)} steps logged: need more than warmup={warmup}")
    ends = times[warmup - 1 :]
    return 60.0 / median([b - a for a, b in zip(ends, ends[1:])])


def sim_ideal(extra: list[str] = (), timeout_s: float = SIM_TIMEOUT_S) -> float:
    """The overlap's compute-only ideal on this machine: `stare sim`'s steps/min at max_staleness 1
    over 0 with this machine's costs measured now (`stare sim --calibrate`: bench step's pieces and
    the engine's timings; docs/performance.md). Run as subprocesses: stare.app imports this package."""
    import subprocess

    sets = [a for x in extra for a in ("--set", x)]
    cli = [sys.executable, "-m", "stare.app.cli", "sim"]

    from learner.engine.deepspeed_engine import child_env  # not this process's MASTER_PORT: its group holds it

    def run(args: list[str]) -> str:
        out = subprocess.run([*cli, *args, *sets], capture_output=True, text=True, timeout=timeout_s, env=child_env())
        if out.returncode != 0:  # the sim's own words, not a bare exit status
            raise RuntimeError(f"stare sim {' '.join(args)} exited {out.returncode}: {out.stderr[-4000:]}")
        return out.stdout

    with tempfile.TemporaryDirectory(prefix="stare-bench-sim-") as tmp:
        profile = Path(tmp) / "cpu.json"
        run(["--calibrate", str(profile)])
        s_per_step = {
            staleness: json.loads(
                run(
                    [
                        "--gpu",
                        "cpu",
                        "--profile",
                        str(profile),
                        "--gpus",
                        "2",
                        "--learner-gpus",
                        "1",
                        "--set",
                        f"system.max_staleness={staleness}",
                        "--steps",
                        "20",
                        "--warmup",
                        "3",
                        "--json",
                    ]
                )
            )["s_per_step"]
            for staleness in (0, 1)
        }
    return s_per_step[0] / s_per_step[1]


def measure(
    *,
    steps: int,
    warmup: int,
    repeats: int,
    rollout: int = 1,
    reward: int = 1,
    extra: list[str] = (),
    log=lambda s: None,
    arm_timeout_s: float = ARM_TIMEOUT_S,
    ideal: bool = False,
) -> list[dict[str, Any]]:
    """One row: overlapped steps/min over synchronous, medians over `repeats` pairs of runs. `ideal`:
    also `stare sim`'s compute-only ideal of that ratio on this machine (`sim_ideal`, measured right
    after the runs), in the row as `ideal` and `of_ideal` (the pass criterion stays TARGET)."""
    results: dict[int, list[float]] = {0: [], 1: []}
    with tempfile.TemporaryDirectory(prefix="stare-bench-overlap-") as tmp:
        for r in range(repeats):
            for staleness in (0, 1) if r % 2 == 0 else (1, 0):
                times = run_arm(staleness, steps, rollout, reward, Path(tmp) / f"r{r}", list(extra), arm_timeout_s)
                results[staleness].append(steps_per_min(times, warmup))
                log(f"repeat {r}: max_staleness={staleness}: {results[staleness][-1]:.1f} steps/min")
    row = paired_row(
        "overlap",
        f"stare up steps/min, max_staleness 1 vs 0 ({rollout} rollout, {reward} reward "
        f"worker(s), steps {warmup + 1}-{steps} of the tiny config)",
        results[1],
        results[0],
        unit="steps/min",
        target=TARGET,
    )
    if ideal:
        row["ideal"] = sim_ideal(list(extra))
        row["of_ideal"] = row["ratio"] / row["ideal"]
        row["what"] += f"; compute-only ideal {row['ideal']:.2f}x (stare sim), {row['of_ideal']:.0%} of it"
        log(f"stare sim's compute-only ideal: {row['ideal']:.2f}x")
    return [row]


def run(quick: bool) -> list[dict[str, Any]]:
    return measure(**(QUICK if quick else FULL), ideal=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--rollout", type=int, default=1)
    parser.add_argument("--reward", type=int, default=1)
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--no-ideal", action="store_true", help="skip stare sim's compute-only ideal")
    args = parser.parse_args(argv)
    rows = measure(
        steps=args.steps,
        warmup=args.warmup,
        repeats=args.repeats,
        rollout=args.rollout,
        reward=args.reward,
        extra=args.overrides,
        log=lambda s: print(s, flush=True),
        ideal=not args.no_ideal,
    )
    print("ours = overlapped (max_staleness 1), baseline = synchronous (max_staleness 0)")
    print(format_table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
