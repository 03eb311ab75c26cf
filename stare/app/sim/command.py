"""`stare sim`: a GPU node simulated on this machine, running the real scheduling (docs/performance.md).

    stare sim --config configs/paper/short-cot-qwen2.5-math-7b-stare.yaml --gpus 8 --gpu h100-80gb \
        --learner-gpus 4 --gantt sim.png
    stare sim --gpu cpu --profile cpu-profile.json          # the tiny config with costs measured here
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

STEPS, WARMUP = 6, 2


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "sim",
        help="simulate a GPU node running this config (the real scheduling, GPU work from a "
        "cost model): tokens/s/GPU, busy fractions, the bottleneck, a Gantt chart",
    )
    p.add_argument("--config", type=Path, default=None, help="YAML config (default: the bundled tiny config)")
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config field or a workload setting (sim.*: stare/app/sim/workload.py)",
    )
    p.add_argument("--gpus", type=int, default=8, help="GPUs of the node (default 8)")
    p.add_argument(
        "--gpu", default="h100-80gb", help="h100-80gb, h200, h800, h20, a100-80gb, l40s, b200, or cpu (with --profile)"
    )
    p.add_argument("--learner-gpus", type=int, default=None, help="learner GPUs (default: system.learner_ranks)")
    p.add_argument(
        "--colocated",
        action="store_true",
        help="learner and engines on the same GPUs (engines sleep while the learner steps)",
    )
    p.add_argument("--model-config", type=Path, default=None, help="a Hugging Face config.json to take the shape from")
    p.add_argument("--profile", type=Path, default=None, help="--gpu cpu: costs measured here (stare sim --calibrate)")
    p.add_argument(
        "--calibrate",
        type=Path,
        default=None,
        metavar="OUT.json",
        help="measure this machine's CPU costs of the bundled tiny config with --set's overrides (bench step + "
        "engine timings), write them",
    )
    p.add_argument("--steps", type=int, default=STEPS, help=f"steps measured (default {STEPS})")
    p.add_argument("--warmup", type=int, default=WARMUP, help=f"steps not measured (default {WARMUP})")
    p.add_argument("--gantt", type=Path, default=None, help="write a Gantt chart PNG of a few steps here")
    p.add_argument(
        "--corner",
        choices=("pessimistic", "central", "optimistic"),
        default=None,
        help="one corner of the cost model's ranges only (default: all three, every figure as central [low, high])",
    )
    p.add_argument(
        "--constants", action="store_true", help="print the cost model's constants with their ranges and sources"
    )
    p.add_argument(
        "--validate",
        nargs="*",
        default=None,
        metavar="ROW",
        help="simulate peers' published runs with their own splits and settings (stare/app/sim/validate.py; all "
        "rows, or the ones named) and print published vs modelled",
    )
    p.add_argument(
        "--from-run",
        type=Path,
        default=None,
        metavar="RUN",
        help="a run folder: its measured step pieces (metrics.jsonl) beside the model's for its config on this node "
        "(--gpu/--gpus/--model-config, or --gpu cpu --profile P for a run on this machine)",
    )
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.set_defaults(fn=run)
    return p


def load(args):
    """(config, sim settings) from the arguments."""
    from stare.app.sim.design import split_overrides
    from stare.config import load_config

    passed, sim = split_overrides(args.config, args.overrides)
    if getattr(args, "colocated", False):  # the product's switch: its colocated node and its checks
        passed.append("system.colocate=on")
    if args.config is None:
        from importlib.resources import files

        args.config = Path(str(files("stare.configs") / "tiny-cpu.yaml"))
    return load_config(args.config, overrides=passed), sim


def run(args) -> int:
    if args.constants:
        from stare.app.sim.constants import markdown_table

        print(markdown_table())
        return 0
    if args.validate is not None:
        return _validate(args)
    if args.from_run is not None:
        try:
            return _from_run(args)
        except ValueError as err:
            print(f"stare sim: {err}", file=sys.stderr)
            return 2
    if args.calibrate is not None:
        from stare.app.sim.calibrate import calibrate
        from stare.app.sim.design import split_overrides

        cfg, _ = load(args)
        profile = calibrate(
            cfg, overrides=split_overrides(args.config, args.overrides)[0], log=lambda s: print(s, file=sys.stderr)
        )
        args.calibrate.write_text(json.dumps(profile, indent=2) + "\n")
        print(json.dumps(profile, indent=2))
        return 0
    try:
        cfg, sim = load(args)
        return _simulate(args, cfg, sim)
    except ValueError as err:
        print(f"stare sim: {err}", file=sys.stderr)
        return 2


def _simulate(args, cfg, sim) -> int:
    from stare.app.sim.design import build_design, cpu_costs, load_profile, simulate
    from stare.app.sim.report import band_of, gantt, render

    if args.gpu == "cpu":
        if args.profile is None:
            print("stare sim: --gpu cpu needs --profile FILE (write one with --calibrate FILE)", file=sys.stderr)
            return 2
        design = build_design(
            cfg, sim, gpus=args.gpus, learner_gpus=args.learner_gpus or 1, colocated=False, on_gpu=False
        )
        profile = load_profile(args.profile)
        costs, lengths = cpu_costs(profile, cfg)
        sim.knobs.setdefault("sim.prompt_tokens", round(profile.get("prompt_mean", 1)))
        result, summary = simulate(cfg, sim, design, costs, lengths, steps=args.steps, warmup=args.warmup)
    else:
        from stare.app.sim.bands import simulate_band
        from stare.plan.sizes import load_model_shape

        design = build_design(cfg, sim, gpus=args.gpus, learner_gpus=args.learner_gpus, colocated=args.colocated)
        shape = load_model_shape(cfg, args.model_config)
        corners = (args.corner,) if args.corner else ("pessimistic", "central", "optimistic")
        band = simulate_band(cfg, sim, design, shape, args.gpu, steps=args.steps, warmup=args.warmup, corners=corners)
        result, summary = band[corners[0]] if args.corner else band["central"]
        if not args.corner:
            summary = band_of({c: s for c, (_, s) in band.items()})
    if args.gantt is not None:
        summary["gantt"] = str(gantt(result, summary, args.gantt))
    print(json.dumps(summary, indent=2) if args.json else render(summary))
    return 0


def _validate(args) -> int:
    from stare.app.sim.validate import ROWS, run_row, table

    known = {r.key: r for r in ROWS}
    unknown = [k for k in args.validate if k not in known]
    if unknown:
        print(
            f"stare sim --validate: unknown row(s) {', '.join(unknown)}; choose from {', '.join(known)}",
            file=sys.stderr,
        )
        return 2
    corners = (args.corner,) if args.corner else ("pessimistic", "central", "optimistic")
    results = {}
    for key in args.validate or list(known):
        results[key] = run_row(known[key], corners)
        print(f"{key}: " + ", ".join(f"{c} {s['s_per_step']:.1f} s" for c, s in results[key].items()), file=sys.stderr)
    print(json.dumps(results, indent=2, default=str) if args.json else table(results))
    return 0


def _from_run(args) -> int:
    from stare.app.sim import from_run as fr
    from stare.app.sim.design import (
        build_design,
        cpu_costs,
        gpu_costs,
        lengths_of,
        load_profile,
        simulate,
        split_overrides,
    )
    from stare.config import load_config

    cfg0, metrics = fr.read_run(args.from_run)
    base = [*fr.workload_of(cfg0, metrics), *args.overrides]
    if args.gpu == "cpu" and args.profile is None:
        raise ValueError("--from-run with --gpu cpu needs --profile FILE (write one with --calibrate FILE)")

    def run_with(extra: list[str]) -> dict:
        passed, sim = split_overrides(None, [*base, *extra])
        cfg = load_config(args.from_run / "config.yaml", overrides=passed)
        if args.gpu == "cpu":
            design = build_design(
                cfg, sim, gpus=args.gpus, learner_gpus=args.learner_gpus or 1, colocated=False, on_gpu=False
            )
            profile = load_profile(args.profile)
            costs, lengths = cpu_costs(profile, cfg)
            sim.knobs.setdefault("sim.prompt_tokens", round(profile.get("prompt_mean", 1)))
        else:
            from stare.plan.sizes import load_model_shape

            colocated = cfg.system.colocate == "on"
            design = build_design(cfg, sim, gpus=args.gpus, learner_gpus=args.learner_gpus, colocated=colocated)
            costs = gpu_costs(cfg, sim, design, load_model_shape(cfg, args.model_config), args.gpu)
            lengths = lengths_of(cfg, sim)
        return simulate(cfg, sim, design, costs, lengths, steps=args.steps, warmup=args.warmup)[1]

    summary = run_with([])
    knob = fr.knob_advice(cfg0, summary["tokens_per_s_per_gpu"], lambda extra: run_with(extra)["tokens_per_s_per_gpu"])
    print(fr.render(args.from_run, fr.measured(metrics), fr.modelled(summary), knob))
    return 0
