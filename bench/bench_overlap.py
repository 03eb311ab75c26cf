"""Steps per minute of the distributed system (`stare up`) with rollout and learning overlapped
(`system.max_staleness: 1`) vs synchronous (`max_staleness: 0`), on the tiny config.

Both arms run the same config (configs/tiny-cpu.yaml, the bundled tiny model, 1 rollout and
1 reward worker, no control plane) in this run, one after the other, alternating which goes first
over `--repeats`. Steps/min is measured by the learner's clock between the end of step `--warmup`
and the end of the last step (start-up and the first steps excluded). Ratio = overlapped /
synchronous (target >= 1.5).

Usage: python bench/bench_overlap.py [--steps 40] [--warmup 5] [--repeats 1] [--rollout 1] [--reward 1]
"""

from __future__ import annotations

import argparse
import io
import json
import statistics
import sys
import tempfile
from pathlib import Path


def run_arm(staleness: int, steps: int, rollout: int, reward: int, out: Path, extra: list[str]) -> list[float]:
    from stare.cli import default_config_path
    from stare.config import load_config
    from stare.launch import Launcher

    overrides = [f"run.output_dir={out}", f"run.name=overlap-s{staleness}", f"run.steps={steps}",
                 f"run.checkpoint_every={steps}", f"task.eval_every={10 * steps}", "task.eval_problems=8",
                 f"system.max_staleness={staleness}", "control.port=0", *extra]
    cfg = load_config(default_config_path(), overrides=overrides)
    log = io.StringIO()
    launcher = Launcher(cfg, rollout=rollout, reward=reward, control=False, out=log, color=False)
    try:
        launcher.start()
        code = launcher.supervise(poll_s=0.2)
    finally:
        launcher.stop()
    if code != 0:
        raise RuntimeError(f"max_staleness={staleness}: stare up failed\n{log.getvalue()[-4000:]}")
    metrics = [json.loads(line) for line in (cfg.run_dir / "metrics.jsonl").read_text().splitlines()]
    return [m["time_unix"] for m in metrics]


def steps_per_min(times: list[float], warmup: int) -> float:
    span = times[-1] - times[warmup - 1]
    return (len(times) - warmup) / span * 60.0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--rollout", type=int, default=1)
    parser.add_argument("--reward", type=int, default=1)
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    args = parser.parse_args(argv)
    results: dict[int, list[float]] = {0: [], 1: []}
    with tempfile.TemporaryDirectory(prefix="stare-bench-overlap-") as tmp:
        for r in range(args.repeats):
            for staleness in ((0, 1) if r % 2 == 0 else (1, 0)):
                out = Path(tmp) / f"r{r}"
                times = run_arm(staleness, args.steps, args.rollout, args.reward, out, args.overrides)
                results[staleness].append(steps_per_min(times, args.warmup))
                print(f"repeat {r}: max_staleness={staleness}: {results[staleness][-1]:.1f} steps/min", flush=True)
    print(f"\n{'mode':<34}{'steps/min':>10}")
    sync, overlap = statistics.median(results[0]), statistics.median(results[1])
    print(f"{'synchronous (max_staleness 0)':<34}{sync:>10.1f}")
    print(f"{'overlapped (max_staleness 1)':<34}{overlap:>10.1f}")
    print(f"\nratio overlapped/synchronous: {overlap / sync:.2f} (target >= 1.50)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
