"""What each `stare` subcommand does. Heavy imports (torch, DeepSpeed, transformers) happen inside
each command, after argument parsing, so `--help` is instant."""

from __future__ import annotations

import sys
from pathlib import Path

from stare.app.cli.args import _load, _overrides, default_config_path
from stare.config.base import ConfigError


def cmd_train(args) -> int:
    from stare.app.launch.embedded import run_training
    from stare.app.launch.run_folder import prepare_run
    from stare.config import ConfigError

    if args.resume is not None:
        if args.config is not None or args.algo is not None:
            raise ConfigError(
                "--resume continues a run with its saved config (--config and --algo do not apply); "
                "use --set to change fields"
            )
        cfg = prepare_run(None, args.resume, _overrides(args))
        run_training(cfg, resume=True, progress=not args.no_progress)
    else:
        cfg = prepare_run(_load(args), None)
        run_training(cfg, resume=False, progress=not args.no_progress)
    return 0


def cmd_convert_verl(args) -> int:
    from stare.config import ConfigError, build_config
    from stare.config.from_verl import convert_verl, read_verl

    path = next((Path(x) for x in args.inputs if "=" not in x and not x.startswith("~")), None)
    overrides = [x for x in args.inputs if "=" in x or x.startswith("~")]
    if path is None and not overrides:
        raise ConfigError("stare convert-verl: give a verl YAML file and/or KEY=VALUE overrides")
    conversion = convert_verl(read_verl(path, overrides), verl_defaults=not args.no_verl_defaults)
    if args.out is not None:
        args.out.write_text(conversion.yaml())
    else:
        print(conversion.yaml(), end="", flush=True)
    print(conversion.report(), file=sys.stderr)
    try:
        build_config(conversion.config)
    except ConfigError as err:  # e.g. a dataset without model.path: the user adds what verl does not say
        print(f"note: the converted config does not validate on its own yet: {err}", file=sys.stderr)
    return 2 if args.strict and conversion.unmapped else 0


def cmd_report(args) -> int:
    from stare.app.report import write_report

    for run in args.runs:
        print(write_report(run) / "summary.md")
    return 0


def cmd_export(args) -> int:
    from learner.engine.export import ExportError, export_checkpoint
    from stare.app.launch.run_folder import run_config
    from stare.models.resolve import resolve_model

    cfg = run_config(args.run, flag="stare export")  # any run, finished, stopped or training: no resume checks
    out = args.out or args.run / ("hf" if args.step is None else f"hf-step-{args.step:06d}")
    try:
        export_checkpoint(
            args.run / "checkpoints", out, model_path=resolve_model(cfg, print), step=args.step, dtype=cfg.model.dtype
        )
    except ExportError as err:
        print(f"stare export: {err}", file=sys.stderr)
        return 1
    print(out)
    return 0


def cmd_build_model(args) -> int:
    from stare.models.tiny import main

    return main(args.rest) or 0


def cmd_sandbox(args) -> int:
    from reward.sandbox_cli import main

    return main(args.rest) or 0


def cmd_control(args) -> int:

    from services.control.app import create_app
    from services.control.server import serve_forever
    from stare.runstate.redis_state import RedisRunState
    from stare.runtime.process import redis_url

    cfg = _load(args)
    state = RedisRunState.connect(
        redis_url(cfg, args.redis_url, args.redis_url_file),
        cfg.run.name,
        dead_after_s=cfg.system.dead_after_s,
        forget_after_s=cfg.system.forget_after_s,
    )
    app = create_app(state, cfg.control_plane, cfg.run.name)
    serve_forever(app, args.host or cfg.control_plane.host, cfg.control_plane.port if args.port is None else args.port)
    return 0


def cmd_bench(args) -> int:
    from stare.app.bench.registry import select
    from stare.app.bench.suite import run_suite

    try:
        names = select(args.names)
    except ValueError as err:
        print(f"stare bench: {err}", file=sys.stderr)
        return 2
    rows = run_suite(names, quick=args.quick, json_path=args.json)
    if any(r.get("error") for r in rows):
        return 1
    if args.strict and any(r["pass"] is False for r in rows):
        return 1
    return 0


def cmd_ctl(args) -> int:
    from stare.app.cli.ctl import run

    return run(args)


def cmd_role(args) -> int:
    import os

    # c10d logs a warning each time a store wait times out (the weight receiver waits in 1 s slices)
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")

    from stare.app.launch.role_entry import run_role
    from stare.runtime.process import redis_url, resolve_worker_name, setup_logging

    cfg = _load(args)
    url = redis_url(cfg, args.redis_url, args.redis_url_file)
    name = resolve_worker_name(args.command, args.name or ("learner" if args.command == "learner" else None), cfg, url)
    setup_logging(args.command, name, fmt=cfg.logging.format)
    extra = {"workers": args.workers} if args.command == "reward" else {}
    run_role(args.command, cfg, redis_url=url, name=name, **extra)
    return 0


def _up_command(args) -> str:
    """The `stare up ... --print-compose` line that reproduces a generated file (its header)."""
    flags = [
        ("--config", args.config),
        ("--algo", args.algo),
        ("--gpus", args.gpus),
        ("--learner-gpus", args.learner_gpus),
        ("--learner-ranks", args.learner_ranks),
        ("--rollout-gpus", args.rollout_gpus),
        ("--rollout", args.rollout),
        ("--reward", args.reward),
    ]
    words = ["stare", "up"] + [w for flag, v in flags if v is not None for w in (flag, str(v))]
    words += [w for o in args.overrides for w in ("--set", o)]
    if args.compose_base != Path("docker-compose.yml"):
        words += ["--compose-base", str(args.compose_base)]
    return " ".join(words + ["--print-compose"])


def _redis_url(args) -> str | None:
    from stare.transport.redis_secrets import resolve_url

    url = args.redis_url
    if url or args.redis_url_file:  # plus STARE_REDIS_PASSWORD_FILE when the URL has no password
        url = resolve_url("", url=url, url_file=args.redis_url_file)
    return url


def _gpu_count(value: str | float | None, flag: str) -> float | None:
    """--learner-gpus / --rollout-gpus under --target ray: a number of GPUs an actor requests."""
    if value is None:
        return None
    try:
        return float(value)
    except ValueError:
        raise ConfigError(
            f"{flag} {value!r}: with --target ray it is the number of GPUs an actor requests "
            "(e.g. 1 or 0.5), not GPU ids"
        ) from None


def cmd_up(args) -> int:
    if args.target == "ray":
        return _up_ray(args, rollout=1 if args.rollout is None else args.rollout)
    if args.target == "compose":
        return _up_compose(args)
    from stare.app.launch.up import up

    return up(
        _load(args),
        rollout=args.rollout,
        reward=args.reward,
        redis_url=_redis_url(args),
        control=not args.no_control,
        gpus=args.gpus,
        learner_gpus=args.learner_gpus,
        rollout_gpus=args.rollout_gpus,
        learner_ranks=args.learner_ranks,
        print_plan=args.print_plan,
        print_compose=args.compose_base if args.print_compose else None,
        max_restarts=args.max_restarts,
        command=_up_command(args),
    )


def _up_compose(args) -> int:
    from stare.app.launch.compose_launcher import ComposeLauncher
    from stare.app.launch.run import run_until_done
    from stare.plan.gpu_map import node_gpu_count

    if args.config is not None or args.overrides or args.algo is not None:
        raise ConfigError(
            "--target compose runs the services with the config docker-compose.yml mounts "
            "(configs/gpu-node.yaml, configs/compose-cpu.yaml): edit that file instead of --config / "
            "--set / --algo, or use --target processes"
        )
    gpus = node_gpu_count() if args.gpus is None else args.gpus
    return run_until_done(
        ComposeLauncher(_load(args), compose_file=args.compose_base, profile="gpu" if gpus else "cpu")
    )


def _up_ray(args, *, rollout: int) -> int:
    from stare.app.launch.ray import launch_ray

    return launch_ray(
        _load(args),
        address=args.address,
        rollout=rollout,
        reward=args.reward,
        redis_url=_redis_url(args),
        control=not args.no_control,
        learner_gpus=_gpu_count(args.learner_gpus, "--learner-gpus"),
        rollout_gpus=_gpu_count(args.rollout_gpus, "--rollout-gpus"),
        max_restarts=args.max_restarts,
        start_timeout_s=args.start_timeout_s,
    )


def cmd_doctor(args) -> int:
    import json

    from stare.app.doctor.registry import GROUPS, Context
    from stare.app.doctor.report import render
    from stare.app.doctor.runner import run_doctor
    from stare.config import ConfigError

    groups = [g.strip() for g in args.only.split(",") if g.strip()] if args.only else None
    unknown = sorted(set(groups or ()) - set(GROUPS))
    if unknown:
        raise ConfigError(f"--only: unknown group(s) {unknown}; the groups are {', '.join(GROUPS)}")
    if args.config is not None and not args.config.is_file():
        raise ConfigError(f"--config {args.config}: no such file")
    out = args.out.resolve()
    config = str(args.config.resolve()) if args.config else None
    report = run_doctor(Context(out=str(out), config=config, overrides=tuple(args.overrides)), groups)
    (out / "doctor.json").write_text(json.dumps(report, indent=1))
    print(render(report), end="")
    print(f"report: {out / 'doctor.json'} (attach it to a bug report)")
    return 1 if report["summary"]["fail"] else 0


def cmd_plan(args) -> int:
    from stare.plan.gpu_memory import build_plan
    from stare.plan.render import render, render_json
    from stare.plan.sizes import load_model_shape

    cfg = _load(args)
    gpu_mem = args.gpu_mem_gib
    if gpu_mem is None:
        import torch

        gpu_mem = torch.cuda.get_device_properties(0).total_memory / 2**30 if torch.cuda.is_available() else 80.0
    gpus = args.gpus if args.gpus is not None else cfg.system.learner_ranks
    plan_shape = load_model_shape(cfg, args.model_config)
    name = str(args.config or default_config_path())
    from stare.config.colocation import node_colocated

    if args.gpus == 1 and cfg.system.colocate != "off":  # one GPU: stare train's colocated loop
        from stare.plan.colocation import build_one_gpu_plan

        plan = build_one_gpu_plan(
            cfg, gpu_mem_gib=gpu_mem, shape=plan_shape, prompt_tokens=args.prompt_tokens, config_name=name
        )
    elif node_colocated(cfg) and gpus > 1:  # every learner rank hosts an engine (stare up, system.colocate on)
        from stare.plan.colocation import build_node_plan

        plan = build_node_plan(
            cfg, gpus=gpus, gpu_mem_gib=gpu_mem, shape=plan_shape, prompt_tokens=args.prompt_tokens, config_name=name
        )
    else:
        plan = build_plan(
            cfg, gpus=gpus, gpu_mem_gib=gpu_mem, shape=plan_shape, prompt_tokens=args.prompt_tokens, config_name=name
        )
    print(render_json(plan) if args.json else render(plan))
    if args.node_gpus is not None:  # the placement and throughput stare sim models (stare/app/sim/placement.py)
        from stare.app.sim.placement import plan_text

        print(plan_text(cfg, gpus=args.node_gpus, gpu=args.gpu, gpu_mem_gib=gpu_mem, shape=plan_shape))
    return 0 if plan.fits else 1


def cmd_launch(args) -> int:
    """`stare launch --ray`: the old spelling of `stare up --target ray`."""
    print("stare launch --ray is deprecated: use `stare up --target ray` (same options)", file=sys.stderr)
    return _up_ray(args, rollout=args.rollout)
