"""`stare compare`: runs side by side (stare.app.report.compare): existing run folders as they are, and/or
new runs trained for --algos x --seeds on one config (each its own `stare train` process)."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from stare.app.cli.args import _load


def stem(base: str) -> str:
    """A config's run name without a preset suffix of its own (`tiny-stare` -> `tiny`)."""
    from stare.config import ALGO_PRESETS

    for preset in sorted(ALGO_PRESETS, key=len, reverse=True):
        if base.endswith(f"-{preset}") and len(base) > len(preset) + 1:
            return base[: -len(preset) - 1]
    return base


def run_name(base: str, algo: str, seed: int) -> str:
    """The name of a trained run: the stem, the preset, the seed (`cmp` -> `cmp-grpo-s0`, never
    `cmp-cmp-grpo-s0`; `tiny-stare` -> `tiny-grpo-s0`)."""
    return f"{stem(base)}-{algo}-s{seed}"


def final_samples_override(cfg, overrides: list[str], ks: tuple[int, ...]) -> list[str]:
    """`--set task.final_eval_k=K` when the config's last evaluation samples fewer than the largest pass@k
    shown (and the user set none): otherwise the run is left as configured."""
    if any(o.startswith("task.final_eval_k=") for o in overrides):
        return []
    final = cfg.task.final_eval_k if cfg.task.final_eval_k is not None else cfg.task.eval_k
    return [f"task.final_eval_k={max(ks)}"] if final < max(ks) else []


def _check_run(path: Path) -> Path:
    from stare.config import ConfigError

    if not (path / "metrics.jsonl").is_file():
        raise ConfigError(
            f"stare compare {path}: not a run folder (no metrics.jsonl); pass folders `stare train` wrote"
        )
    return path


def cmd_compare(args) -> int:
    from learner.engine.deepspeed_engine import child_env
    from stare.app.report import write_comparison
    from stare.config import ConfigError

    try:
        ks = tuple(sorted({int(k) for k in args.pass_k.split(",") if k.strip()}))
    except ValueError:
        raise ConfigError(f"--pass-k {args.pass_k!r}: comma-separated integers, e.g. 1,8,64") from None
    if not ks or ks[0] < 1:
        raise ConfigError(f"--pass-k {args.pass_k!r}: each k must be >= 1")
    run_dirs = [_check_run(Path(r)) for r in args.runs]
    algos_arg = args.algos if args.algos is not None else (None if run_dirs else "stare,grpo-matched")
    out = args.out
    if algos_arg:
        base = _load(argparse.Namespace(config=args.config, algo=None, overrides=args.overrides))
        extra = final_samples_override(base, args.overrides, ks)
        for algo in [a.strip() for a in algos_arg.split(",") if a.strip()]:
            for seed in [int(s) for s in args.seeds.split(",")]:
                name = run_name(base.run.name, algo, seed)
                cmd = [sys.executable, "-m", "stare.app.cli", "train", "--algo", algo, "--no-progress"]
                if args.config is not None:
                    cmd += ["--config", str(args.config)]
                for o in [*args.overrides, *extra, f"run.seed={seed}", f"run.name={name}"]:  # the last ones win
                    cmd += ["--set", o]
                print(f"[compare] {algo} seed {seed} -> {base.run.output_dir / name}", flush=True)
                subprocess.run(cmd, check=True, timeout=args.timeout_s, env=child_env())
                run_dirs.append(base.run.output_dir / name)
        out = out or base.run.output_dir / f"{stem(base.run.name)}-compare"
    out = out or run_dirs[0].parent / "compare"
    write_comparison(run_dirs, out, ks)
    print(f"[compare] {out / 'compare.png'} and {out / 'compare.md'}")
    return 0
