"""The `stare` command. Heavy imports (torch, DeepSpeed, transformers) happen inside the
subcommands, after argument parsing, so `--help` is instant."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path


def default_config_path() -> Path:
    from importlib.resources import files

    return Path(str(files("stare.configs") / "tiny-cpu.yaml"))


def _config_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", type=Path, default=None,
                   help="YAML config (default: the bundled configs/tiny-cpu.yaml)")
    p.add_argument("--algo", default=None,
                   help="algorithm preset: stare, grpo, grpo-ds, dapo, entropy-bonus, clip-cov, kl-cov, 80-20")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config field, e.g. --set optim.lr=1e-5 (repeatable)")


def _log_format_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--log-format", choices=["text", "json"], default=None,
                   help="log lines as text or one JSON object per line for log shippers (default: logging.format)")


def _overrides(args) -> list[str]:
    """--set overrides plus the ones a flag stands for (--log-format)."""
    fmt = getattr(args, "log_format", None)
    return [*args.overrides, *([f"logging.format={fmt}"] if fmt else [])]


def _load(args):
    from stare.config import load_config

    return load_config(args.config or default_config_path(), algo=args.algo, overrides=_overrides(args))


def cmd_train(args) -> int:
    from stare.embedded import prepare_run, run_training

    if args.resume is not None:
        if args.config is not None or args.algo is not None:
            raise SystemExit("--resume continues a run with its saved config; use --set to change fields")
        cfg = prepare_run(None, args.resume, _overrides(args))
        run_training(cfg, resume=True, progress=not args.no_progress)
    else:
        cfg = prepare_run(_load(args), None)
        run_training(cfg, resume=False, progress=not args.no_progress)
    return 0


def cmd_compare(args) -> int:
    from stare.learner.deepspeed_engine import child_env
    from stare.report import write_comparison

    base = _load(argparse.Namespace(config=args.config, algo=None, overrides=args.overrides))
    algos = [a.strip() for a in args.algos.split(",") if a.strip()]
    seeds = [int(s) for s in args.seeds.split(",")]
    run_dirs = []
    for algo in algos:
        for seed in seeds:
            name = f"{base.run.name}-cmp-{algo}-s{seed}"
            cmd = [sys.executable, "-m", "stare.cli", "train", "--algo", algo, "--no-progress"]
            if args.config is not None:
                cmd += ["--config", str(args.config)]
            for o in args.overrides:
                cmd += ["--set", o]
            if not any(o.startswith("task.final_eval_k=") for o in args.overrides):
                cmd += ["--set", "task.final_eval_k=64"]  # pass@k curves up to 64 (compare.md)
            cmd += ["--set", f"run.seed={seed}", "--set", f"run.name={name}"]  # last: these win
            print(f"[compare] {algo} seed {seed} -> {base.run.output_dir / name}", flush=True)
            subprocess.run(cmd, check=True, timeout=args.timeout_s, env=child_env())
            run_dirs.append(base.run.output_dir / name)
    out = args.out or base.run.output_dir / f"{base.run.name}-compare"
    write_comparison(run_dirs, out)
    print(f"[compare] {out / 'compare.png'} and {out / 'compare.md'}")
    return 0


def cmd_report(args) -> int:
    from stare.report import write_report

    for run in args.runs:
        print(write_report(run) / "summary.md")
    return 0


def cmd_export(args) -> int:
    from stare.embedded import prepare_run
    from stare.models import resolve_model
    from stare.learner.export import ExportError, export_checkpoint

    cfg = prepare_run(None, args.run)
    out = args.out or args.run / ("hf" if args.step is None else f"hf-step-{args.step:06d}")
    try:
        export_checkpoint(args.run / "checkpoints", out, model_path=resolve_model(cfg, print), step=args.step,
                          dtype=cfg.model.dtype)
    except ExportError as err:
        print(f"stare export: {err}", file=sys.stderr)
        return 1
    print(out)
    return 0


def cmd_build_model(args) -> int:
    from stare.tiny import main

    return main(args.rest) or 0


def cmd_sandbox(args) -> int:
    from stare.reward.sandbox_cli import main

    return main(args.rest) or 0


def cmd_control(args) -> int:

    from stare.runstate.redis_state import RedisRunState
    from stare.services.control.app import create_app
    from stare.services.control.server import serve_forever

    from stare.runtime import redis_url

    cfg = _load(args)
    state = RedisRunState.connect(redis_url(cfg, args.redis_url, args.redis_url_file), cfg.run.name,
                                  dead_after_s=cfg.system.dead_after_s, forget_after_s=cfg.system.forget_after_s)
    app = create_app(state, cfg.control, cfg.run.name)
    serve_forever(app, args.host or cfg.control.host, cfg.control.port if args.port is None else args.port)
    return 0


def cmd_bench(args) -> int:
    from stare.bench.registry import select
    from stare.bench.suite import run_suite

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


def _bench_epilog() -> str:
    from stare.bench.registry import BENCHMARKS, SECTIONS

    lines = ["benchmarks (each against a baseline measured in the same run; docs/performance.md):"]
    lines += [f"  {name:<20}{b.summary}" for name, b in BENCHMARKS.items()]
    lines += ["sections: " + "; ".join(f"{s} = {' '.join(names)}" for s, names in SECTIONS.items()),
              "The GPU benchmarks print a row saying 'skipped' where CUDA is absent."]
    return "\n".join(lines)


def cmd_ctl(args) -> int:
    from stare.ctl import run

    return run(args)


def _role_args(p: argparse.ArgumentParser) -> None:
    _config_args(p)
    p.add_argument("--redis-url", default=None, help="Redis URL (default: STARE_REDIS_URL_FILE's content, else "
                   "STARE_REDIS_URL, else system.redis_url; STARE_REDIS_PASSWORD_FILE adds a password). Visible in ps: "
                   "prefer --redis-url-file")
    p.add_argument("--redis-url-file", default=None, help="file holding the Redis URL with its password (a secret)")
    p.add_argument("--name", default=None,
                   help="worker name, also its stream consumer name (default: STARE_WORKER_NAME, else ROLE-HOST-PID); "
                   "'{slot}' in it takes the lowest free replica slot (stare/runtime.py)")
    _log_format_arg(p)


def cmd_role(args) -> int:
    import os

    # c10d logs a warning each time a store wait times out (the weight receiver waits in 1 s slices)
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")

    from stare.role_entry import run_role
    from stare.runtime import redis_url, resolve_worker_name, setup_logging

    cfg = _load(args)
    url = redis_url(cfg, args.redis_url, args.redis_url_file)
    name = resolve_worker_name(args.command, args.name or ("learner" if args.command == "learner" else None), cfg, url)
    setup_logging(args.command, name, fmt=cfg.logging.format)
    extra = {"workers": args.workers} if args.command == "reward" else {}
    run_role(args.command, cfg, redis_url=url, name=name, **extra)
    return 0


def _up_command(args) -> str:
    """The `stare up ... --print-compose` line that reproduces a generated file (its header)."""
    flags = [("--config", args.config), ("--algo", args.algo), ("--gpus", args.gpus),
             ("--learner-gpus", args.learner_gpus), ("--learner-ranks", args.learner_ranks),
             ("--rollout-gpus", args.rollout_gpus),
             ("--rollout", args.rollout), ("--reward", args.reward)]
    words = ["stare", "up"] + [w for flag, v in flags if v is not None for w in (flag, str(v))]
    words += [w for o in args.overrides for w in ("--set", o)]
    if args.compose_base != Path("docker-compose.yml"):
        words += ["--compose-base", str(args.compose_base)]
    return " ".join(words + ["--print-compose"])


def cmd_up(args) -> int:
    from stare.launch import up

    return up(_load(args), rollout=args.rollout, reward=args.reward, redis_url=args.redis_url,
              control=not args.no_control, gpus=args.gpus, learner_gpus=args.learner_gpus,
              rollout_gpus=args.rollout_gpus, learner_ranks=args.learner_ranks, print_plan=args.print_plan,
              print_compose=args.compose_base if args.print_compose else None,
              command=_up_command(args))


def cmd_plan(args) -> int:
    from stare.plan import build_plan, load_model_shape, render, render_json

    cfg = _load(args)
    gpu_mem = args.gpu_mem_gib
    if gpu_mem is None:
        import torch

        gpu_mem = torch.cuda.get_device_properties(0).total_memory / 2**30 if torch.cuda.is_available() else 80.0
    gpus = args.gpus if args.gpus is not None else cfg.system.learner_ranks
    plan = build_plan(cfg, gpus=gpus, gpu_mem_gib=gpu_mem, shape=load_model_shape(cfg, args.model_config),
                      prompt_tokens=args.prompt_tokens, config_name=str(args.config or default_config_path()))
    print(render_json(plan) if args.json else render(plan))
    return 0 if plan.fits else 1


def cmd_launch(args) -> int:
    from stare.ray_launch import launch_ray
    from stare.transport.redis_secrets import resolve_url

    url = args.redis_url
    if url or args.redis_url_file:  # plus STARE_REDIS_PASSWORD_FILE when the URL has no password
        url = resolve_url("", url=url, url_file=args.redis_url_file)
    return launch_ray(_load(args), address=args.address, rollout=args.rollout, reward=args.reward,
                      redis_url=url, control=not args.no_control, learner_gpus=args.learner_gpus,
                      rollout_gpus=args.rollout_gpus, max_restarts=args.max_restarts,
                      start_timeout_s=args.start_timeout_s)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="stare", description="RL post-training of LLMs with STARE.")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("train", help="train in one process (embedded mode: CPU, bundled tiny model and task)")
    _config_args(p)
    p.add_argument("--resume", type=Path, default=None, metavar="RUN_DIR", help="continue the run in RUN_DIR")
    p.add_argument("--no-progress", action="store_true", help="no progress bar or log lines")
    _log_format_arg(p)
    p.set_defaults(fn=cmd_train)

    p = sub.add_parser("compare", help="train several algorithms x seeds on one config; one figure and table")
    p.add_argument("--config", type=Path, default=None, help="YAML config (default: configs/tiny-cpu.yaml)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--algos", default="stare,grpo", help="comma-separated presets (default: stare,grpo)")
    p.add_argument("--seeds", default="0", help="comma-separated seeds (default: 0)")
    p.add_argument("--out", type=Path, default=None, help="output folder (default: runs/<name>-compare)")
    p.add_argument("--timeout-s", type=float, default=6 * 3600, help="limit per training run")
    p.set_defaults(fn=cmd_compare)

    p = sub.add_parser("up", help="run the distributed system on this machine: redis, control, learner, "
                       "N rollout and M reward workers as separate processes")
    _config_args(p)
    p.add_argument("--rollout", type=int, default=None, help="rollout worker processes (default: one per "
                   "rollout.engine.tensor_parallel_size rollout GPUs; 1 without GPUs)")
    p.add_argument("--reward", type=int, default=1, help="reward worker processes (default 1)")
    p.add_argument("--redis-url", default=None, help="use this Redis instead of starting a redis-server")
    p.add_argument("--no-control", action="store_true", help="do not start the control plane")
    p.add_argument("--learner-ranks", type=int, default=None, metavar="N",
                   help="learner processes (DeepSpeed data-parallel ranks, one GPU each; default: "
                   "system.learner_ranks, or one per --learner-gpus GPU)")
    p.add_argument("--learner-gpus", default=None, metavar="IDS",
                   help="GPUs of the learner, one per rank, e.g. 0 or 0-3 (default: the first learner_ranks GPUs)")
    p.add_argument("--rollout-gpus", default=None, metavar="IDS",
                   help="GPUs of the rollout workers, e.g. 1-7 (default: every GPU the learner does not use)")
    p.add_argument("--gpus", type=int, default=None, metavar="N",
                   help="plan for N GPUs instead of the ones this machine shows (with --print-plan)")
    p.add_argument("--print-plan", action="store_true",
                   help="print every role's command, environment (CUDA_VISIBLE_DEVICES) and ports; start nothing")
    p.add_argument("--print-compose", action="store_true",
                   help="print the GPU services of docker-compose.yml for this plan (learner, one rollout service "
                   "per GPU set, reward replicas) as a Compose file; redirect it to docker-compose.gpus.yml "
                   "(docs/deploy.md); start nothing")
    p.add_argument("--compose-base", type=Path, default=Path("docker-compose.yml"), metavar="FILE",
                   help="the docker-compose.yml whose x-learner-gpu/x-rollout-gpu templates --print-compose fills "
                   "(default: ./docker-compose.yml)")
    p.set_defaults(fn=cmd_up)

    p = sub.add_parser("launch", help="run the distributed system on a Ray cluster: the roles of `stare up` as "
                       "Ray actors with GPU requests, restarted by Ray when they crash")
    _config_args(p)
    p.add_argument("--ray", action="store_true", required=True,
                   help="run on Ray (the only backend; `stare up` runs the roles as local processes)")
    p.add_argument("--address", default=None,
                   help="Ray cluster: HOST:6379, ray://HOST:10001, or auto for the one `ray start --head` started on "
                   "this machine (default: RAY_ADDRESS, else a new local Ray instance for this run)")
    p.add_argument("--rollout", type=int, default=1, help="rollout actors (default 1)")
    p.add_argument("--reward", type=int, default=1, help="reward actors (default 1)")
    p.add_argument("--redis-url", default=None,
                   help="Redis every node reaches (default: start a redis-server here; single-node clusters only); "
                   "STARE_REDIS_PASSWORD_FILE adds a password")
    p.add_argument("--redis-url-file", default=None, help="file holding that Redis URL with its password (a secret)")
    p.add_argument("--no-control", action="store_true", help="do not start the control plane actor")
    p.add_argument("--learner-gpus", type=float, default=None,
                   help="GPUs the learner actor requests (default: system.learner_ranks if the cluster has GPUs, "
                   "else 0)")
    p.add_argument("--rollout-gpus", type=float, default=None,
                   help="GPUs each rollout actor requests (default: 1 if the cluster has GPUs, else 0)")
    p.add_argument("--max-restarts", type=int, default=5, help="restarts Ray makes of each crashed actor (default 5)")
    p.add_argument("--start-timeout-s", type=float, default=600.0,
                   help="limit for the whole start: actors placed (e.g. waiting for GPUs) and answering (default 600)")
    p.set_defaults(fn=cmd_launch)

    p = sub.add_parser("plan", help="the GPU memory a config needs per role (weights, gradients, optimizer state "
                       "per ZeRO stage, activations, logits, vLLM's KV cache), whether it fits, and what to change; "
                       "exit status 1 when a role does not fit")
    _config_args(p)
    p.add_argument("--gpus", type=int, default=None,
                   help="learner GPUs (ZeRO data-parallel ranks; default: system.learner_ranks)")
    p.add_argument("--gpu-mem-gib", type=float, default=None,
                   help="memory of each GPU in GiB (default: this machine's first CUDA device, else 80)")
    p.add_argument("--model-config", type=Path, default=None,
                   help="a Hugging Face config.json (or its folder) to plan with instead of model.path's, e.g. "
                   "configs/models/qwen2.5-math-7b.json; no weights are read")
    p.add_argument("--prompt-tokens", type=int, default=None,
                   help="prompt length to plan for (default: data.max_prompt_len where the config has it, else 1024)")
    p.add_argument("--json", action="store_true", help="print the plan as JSON")
    p.set_defaults(fn=cmd_plan)

    p = sub.add_parser("learner", help="the learner process (DeepSpeed, STARE; publishes prompts and weights)")
    _role_args(p)
    p.set_defaults(fn=cmd_role)

    p = sub.add_parser("rollout", help="a rollout worker process (prompts -> sampled trajectories)")
    _role_args(p)
    p.set_defaults(fn=cmd_role)

    p = sub.add_parser("reward", help="a reward worker process (trajectories -> scored trajectories)")
    _role_args(p)
    p.add_argument("--workers", type=int, default=1, help="scoring processes with a hard timeout each (default 1)")
    p.set_defaults(fn=cmd_role)

    p = sub.add_parser("control", help="serve the control plane (API + dashboard) over the run's Redis state")
    _config_args(p)
    p.add_argument("--redis-url", default=None, help="Redis URL (default: STARE_REDIS_URL_FILE's content, else "
                   "STARE_REDIS_URL, else system.redis_url; STARE_REDIS_PASSWORD_FILE adds a password). Visible in ps: "
                   "prefer --redis-url-file")
    p.add_argument("--redis-url-file", default=None, help="file holding the Redis URL with its password (a secret)")
    p.add_argument("--host", default=None, help="listen address (default: control.host)")
    p.add_argument("--port", type=int, default=None, help="listen port (default: control.port)")
    p.set_defaults(fn=cmd_control)

    from stare.ctl import add_arguments

    p = sub.add_parser("ctl", help="talk to a running control plane: status, entropy, pause, resume, checkpoint, history")
    add_arguments(p)
    p.set_defaults(fn=cmd_ctl)

    p = sub.add_parser("bench", help="performance suite: each benchmark against a same-run baseline, one table",
                       epilog=_bench_epilog(), formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("names", nargs="*", metavar="NAME", help="benchmarks or sections to run (default: all)")
    p.add_argument("--quick", action="store_true", help="small sizes: the whole suite in under 5 minutes on 2 cores")
    p.add_argument("--json", type=Path, default=None, metavar="FILE",
                   help="also write the results and the machine's description to FILE")
    p.add_argument("--strict", action="store_true", help="exit 1 when a target is missed (always: when one fails)")
    p.set_defaults(fn=cmd_bench)

    p = sub.add_parser("report", help="(re)write the report of finished runs")
    p.add_argument("runs", type=Path, nargs="+")
    p.set_defaults(fn=cmd_report)

    p = sub.add_parser("export", help="write a run's checkpoint as a Hugging Face model directory (safetensors, "
                       "config, tokenizer, generation config) that transformers and vLLM load")
    p.add_argument("run", type=Path, metavar="RUN_DIR", help="a run folder written by stare train / the learner")
    p.add_argument("--step", type=int, default=None, help="the checkpoint of this step (default: the latest)")
    p.add_argument("--out", type=Path, default=None,
                   help="output folder (default: RUN_DIR/hf, or RUN_DIR/hf-step-NNNNNN with --step)")
    p.set_defaults(fn=cmd_export)

    p = sub.add_parser("build-model", help="build the bundled tiny tokenizer and model", add_help=False)
    p.add_argument("rest", nargs=argparse.REMAINDER)
    p.set_defaults(fn=cmd_build_model)

    p = sub.add_parser("sandbox", help="run untrusted Python under the sandbox: stare sandbox run FILE.py", add_help=False)
    p.add_argument("rest", nargs=argparse.REMAINDER)
    p.set_defaults(fn=cmd_sandbox)
    return parser


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line; build-model and sandbox get their whole argument list (also --help) in
    `rest` for their own parser (argparse's REMAINDER does not take a leading option)."""
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown and getattr(args, "rest", None) is not None:
        args.rest = unknown + args.rest
    elif unknown:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from stare.config import ConfigError

    try:
        return args.fn(args)
    except ConfigError as err:
        print(f"stare: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
