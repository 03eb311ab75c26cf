"""The `stare` command line: the parser of every subcommand, and `main`."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from stare.app.cli.args import _config_args, _log_format_arg, _role_args
from stare.app.cli.commands import (
    cmd_bench,
    cmd_build_model,
    cmd_control,
    cmd_convert_verl,
    cmd_ctl,
    cmd_doctor,
    cmd_export,
    cmd_launch,
    cmd_plan,
    cmd_report,
    cmd_role,
    cmd_sandbox,
    cmd_train,
    cmd_up,
)
from stare.app.cli.compare import cmd_compare
from stare.app.cli.epilogs import bench_epilog, doctor_epilog, doctor_groups


def _ray_args(p) -> None:
    p.add_argument(
        "--address",
        default=None,
        help="--target ray: HOST:6379, ray://HOST:10001, or auto for the one `ray start --head` started on "
        "this machine (default: RAY_ADDRESS, else a new local Ray instance for this run)",
    )
    p.add_argument(
        "--max-restarts",
        type=int,
        default=5,
        help="restarts of each crashed role (processes) or actor (ray) (default 5)",
    )
    p.add_argument(
        "--start-timeout-s",
        type=float,
        default=600.0,
        help="--target ray: limit for the whole start: actors placed (e.g. waiting for GPUs) and answering",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="stare",
        description="RL post-training of LLMs with STARE.",
        epilog="A mistake in a config, dataset, model folder, checkpoint or Redis URL is "
        "one line (exit 2); --debug anywhere (or STARE_DEBUG=1) shows its traceback. "
        "docs/troubleshooting.md lists each error and its fix.",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("train", help="train in one process (embedded mode: CPU, bundled tiny model and task)")
    _config_args(p)
    p.add_argument("--resume", type=Path, default=None, metavar="RUN_DIR", help="continue the run in RUN_DIR")
    p.add_argument("--no-progress", action="store_true", help="no progress bar or log lines")
    _log_format_arg(p)
    p.set_defaults(fn=cmd_train)

    p = sub.add_parser(
        "convert-verl",
        help="translate a verl config (a hydra YAML and/or key=value overrides) into a stare config: the YAML on "
        "stdout, on stderr what each verl setting became and what could not be mapped (docs/from-verl.md)",
    )
    p.add_argument(
        "inputs",
        nargs="*",
        metavar="FILE.yaml | KEY=VALUE",
        help="a verl YAML config, then hydra overrides as a verl launch script passes them (a.b=v, +a.b=v, "
        "++a.b=v, ~a.b)",
    )
    p.add_argument("--out", type=Path, default=None, help="write the stare YAML here instead of stdout")
    p.add_argument(
        "--no-verl-defaults",
        action="store_true",
        help="leave the settings you did not give at stare's defaults (default: verl's, where a run's meaning "
        "depends on them: clip 0.2/0.2, dual-clip 3.0, weight decay 0.01, ...)",
    )
    p.add_argument("--strict", action="store_true", help="exit 2 when a setting could not be mapped")
    p.set_defaults(fn=cmd_convert_verl)

    p = sub.add_parser(
        "compare",
        help="runs side by side (one figure and table): existing run folders as they are (RUN_DIR...), and/or new "
        "runs trained for --algos x --seeds on one config",
    )
    p.add_argument("runs", nargs="*", type=Path, metavar="RUN_DIR", help="run folders to compare (nothing is trained)")
    p.add_argument("--config", type=Path, default=None, help="YAML config (default: configs/tiny-cpu.yaml)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument(
        "--algos",
        default=None,
        help="comma-separated presets to train (default without RUN_DIR: stare,grpo-matched; with RUN_DIR: none)",
    )
    p.add_argument("--seeds", default="0", help="comma-separated seeds (default: 0)")
    p.add_argument(
        "--pass-k",
        default="1,8,64",
        help="pass@k columns (default 1,8,64); a trained run's last evaluation samples the largest k per problem "
        "when its config samples fewer (task.final_eval_k)",
    )
    p.add_argument("--out", type=Path, default=None, help="output folder (default: runs/<name>-compare)")
    p.add_argument("--timeout-s", type=float, default=6 * 3600, help="limit per training run")
    p.set_defaults(fn=cmd_compare)

    p = sub.add_parser(
        "up",
        help="run the distributed system on a target: redis, control, learner, N rollout and M "
        "reward workers as processes of this machine (default), Docker Compose services, or Ray actors",
    )
    _config_args(p)
    p.add_argument(
        "--target",
        choices=("processes", "compose", "ray"),
        default="processes",
        help="where the roles run: processes of this machine (default), the services of "
        "docker-compose.yml on this machine (profile gpu with GPUs, else cpu; their config is the one "
        "the compose file mounts), or actors of a Ray cluster (--address)",
    )
    p.add_argument(
        "--rollout",
        type=int,
        default=None,
        help="rollout worker processes (default: one per "
        "rollout.engine.tensor_parallel_size rollout GPUs; 1 without GPUs)",
    )
    p.add_argument("--reward", type=int, default=1, help="reward worker processes (default 1)")
    p.add_argument("--redis-url", default=None, help="use this Redis instead of starting a redis-server")
    p.add_argument("--redis-url-file", default=None, help="file holding that Redis URL with its password (a secret)")
    p.add_argument("--no-control", action="store_true", help="do not start the control plane")
    _ray_args(p)
    p.add_argument(
        "--learner-ranks",
        type=int,
        default=None,
        metavar="N",
        help="learner processes (DeepSpeed data-parallel ranks, one GPU each; default: "
        "system.learner_ranks, or one per --learner-gpus GPU)",
    )
    p.add_argument(
        "--learner-gpus",
        default=None,
        metavar="IDS",
        help="GPUs of the learner, one per rank, e.g. 0 or 0-3 (default: the first learner_ranks GPUs); "
        "--target ray: the number of GPUs the learner actor requests",
    )
    p.add_argument(
        "--rollout-gpus",
        default=None,
        metavar="IDS",
        help="GPUs of the rollout workers, e.g. 1-7 (default: every GPU the learner does not use); "
        "--target ray: the number of GPUs each rollout actor requests",
    )
    p.add_argument(
        "--gpus",
        type=int,
        default=None,
        metavar="N",
        help="plan for N GPUs instead of the ones this machine shows (with --print-plan)",
    )
    p.add_argument(
        "--print-plan",
        action="store_true",
        help="print every role's command, environment (CUDA_VISIBLE_DEVICES) and ports; start nothing",
    )
    p.add_argument(
        "--print-compose",
        action="store_true",
        help="print the GPU services of docker-compose.yml for this plan (learner, one rollout service "
        "per GPU set, reward replicas) as a Compose file; redirect it to docker-compose.gpus.yml "
        "(docs/deploy.md); start nothing",
    )
    p.add_argument(
        "--compose-base",
        type=Path,
        default=Path("docker-compose.yml"),
        metavar="FILE",
        help="the docker-compose.yml whose x-learner-gpu/x-rollout-gpu templates --print-compose fills "
        "(default: ./docker-compose.yml)",
    )
    p.set_defaults(fn=cmd_up)

    p = sub.add_parser("launch", help="deprecated: `stare up --target ray` (the same options)")
    _config_args(p)
    p.add_argument("--ray", action="store_true", required=True, help="run on Ray (the only backend of launch)")
    p.add_argument("--rollout", type=int, default=1, help="rollout actors (default 1)")
    p.add_argument("--reward", type=int, default=1, help="reward actors (default 1)")
    p.add_argument("--redis-url", default=None, help="Redis every node reaches (default: start a redis-server here)")
    p.add_argument("--redis-url-file", default=None, help="file holding that Redis URL with its password (a secret)")
    p.add_argument("--no-control", action="store_true", help="do not start the control plane actor")
    p.add_argument("--learner-gpus", type=float, default=None, help="GPUs the learner actor requests")
    p.add_argument("--rollout-gpus", type=float, default=None, help="GPUs each rollout actor requests")
    _ray_args(p)
    p.set_defaults(fn=cmd_launch)

    p = sub.add_parser(
        "doctor",
        help="check this node before a run (the first thing to run on a GPU node): versions, GPUs and links, vLLM "
        "sampling, sleep and in-flight updates, the weight broadcast and its stream fences, a ZeRO-3 step, the run's "
        "memory plan; a table and doctor.json for a bug report",
        epilog=doctor_epilog(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--out",
        type=Path,
        default=Path("doctor-out"),
        help="folder for doctor.json and the checks' logs (./doctor-out)",
    )
    p.add_argument(
        "--config",
        type=Path,
        default=None,
        help="the run's config: config.plan plans it against this GPU's free memory",
    )
    p.add_argument(
        "--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE", help="override a --config field"
    )
    p.add_argument(
        "--only", default=None, metavar="GROUPS", help="comma-separated groups: " + ", ".join(doctor_groups())
    )
    p.set_defaults(fn=cmd_doctor)

    p = sub.add_parser(
        "plan",
        help="the GPU memory a config needs per role (weights, gradients, optimizer state "
        "per ZeRO stage, activations, logits, vLLM's KV cache), whether it fits, and what to change; "
        "exit status 1 when a role does not fit",
    )
    _config_args(p)
    p.add_argument(
        "--gpus",
        type=int,
        default=None,
        help="learner GPUs (ZeRO data-parallel ranks; default: system.learner_ranks, rollout on GPUs of its own); "
        "--gpus 1: one GPU shared by the learner and the rollout engine of `stare train`, the engine asleep "
        "while the learner steps (system.colocate; off: the two-GPU plan)",
    )
    p.add_argument(
        "--gpu-mem-gib",
        type=float,
        default=None,
        help="memory of each GPU in GiB (default: this machine's first CUDA device, else 80)",
    )
    p.add_argument(
        "--model-config",
        type=Path,
        default=None,
        help="a Hugging Face config.json (or its folder) to plan with instead of model.path's, e.g. "
        "configs/models/qwen2.5-math-7b.json; no weights are read",
    )
    p.add_argument(
        "--prompt-tokens",
        type=int,
        default=None,
        help="prompt length to plan for (default: data.max_prompt_len where the config has it, else 1024)",
    )
    p.add_argument("--json", action="store_true", help="print the plan as JSON")
    p.add_argument(
        "--node-gpus",
        type=int,
        default=None,
        help="GPUs of the node: also recommend the learner/rollout split (or the node-colocated learner), "
        "max_staleness, over-sampling and in-flight updates that maximise modelled tokens/s/GPU (stare sim), with "
        "the predicted throughput and its band",
    )
    p.add_argument(
        "--gpu",
        default="h100-80gb",
        help="GPU kind for --node-gpus (h100-80gb, h200, h800, h20, a100-80gb, l40s, b200)",
    )
    p.set_defaults(fn=cmd_plan)

    p = sub.add_parser("learner", help="the learner process (DeepSpeed, STARE; publishes prompts and weights)")
    _role_args(p)
    p.set_defaults(fn=cmd_role)

    p = sub.add_parser("rollout", help="a rollout worker process (prompts -> sampled trajectories)")
    _role_args(p)
    p.set_defaults(fn=cmd_role)

    p = sub.add_parser("reward", help="a reward worker process (trajectories -> scored trajectories)")
    _role_args(p)
    p.add_argument(
        "--workers",
        type=int,
        default=None,
        help="scoring processes with a hard time and memory limit each (default: reward.scoring.workers; 1 without "
        "a reward section)",
    )
    p.set_defaults(fn=cmd_role)

    p = sub.add_parser("control", help="serve the control plane (API + dashboard) over the run's Redis state")
    _config_args(p)
    p.add_argument(
        "--redis-url",
        default=None,
        help="Redis URL (default: STARE_REDIS_URL_FILE's content, else "
        "STARE_REDIS_URL, else system.redis_url; STARE_REDIS_PASSWORD_FILE adds a password). Visible in ps: "
        "prefer --redis-url-file",
    )
    p.add_argument("--redis-url-file", default=None, help="file holding the Redis URL with its password (a secret)")
    p.add_argument("--host", default=None, help="listen address (default: control_plane.host)")
    p.add_argument("--port", type=int, default=None, help="listen port (default: control_plane.port)")
    p.set_defaults(fn=cmd_control)

    from stare.app.cli.ctl import add_arguments

    p = sub.add_parser(
        "ctl", help="talk to a running control plane: status, entropy, pause, resume, checkpoint, history"
    )
    add_arguments(p)
    p.set_defaults(fn=cmd_ctl)

    p = sub.add_parser(
        "bench",
        help="performance suite: each benchmark against a same-run baseline, one table",
        epilog=bench_epilog(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("names", nargs="*", metavar="NAME", help="benchmarks or sections to run (default: all)")
    p.add_argument("--quick", action="store_true", help="small sizes: the whole suite in under 5 minutes on 2 cores")
    p.add_argument(
        "--json",
        type=Path,
        default=None,
        metavar="FILE",
        help="also write the results and the machine's description to FILE",
    )
    p.add_argument("--strict", action="store_true", help="exit 1 when a target is missed (always: when one fails)")
    p.set_defaults(fn=cmd_bench)

    p = sub.add_parser("report", help="(re)write the report of finished runs")
    p.add_argument("runs", type=Path, nargs="+")
    p.set_defaults(fn=cmd_report)

    p = sub.add_parser(
        "export",
        help="write a run's checkpoint as a Hugging Face model directory (safetensors, "
        "config, tokenizer, generation config) that transformers and vLLM load",
    )
    p.add_argument("run", type=Path, metavar="RUN_DIR", help="a run folder written by stare train / the learner")
    p.add_argument("--step", type=int, default=None, help="the checkpoint of this step (default: the latest)")
    p.add_argument(
        "--out",
        type=Path,
        default=None,
        help="output folder (default: RUN_DIR/hf, or RUN_DIR/hf-step-NNNNNN with --step)",
    )
    p.set_defaults(fn=cmd_export)

    p = sub.add_parser("build-model", help="build the bundled tiny tokenizer and model", add_help=False)
    p.add_argument("rest", nargs=argparse.REMAINDER)
    p.set_defaults(fn=cmd_build_model)

    p = sub.add_parser(
        "sandbox", help="run untrusted Python under the sandbox: stare sandbox run FILE.py", add_help=False
    )
    p.add_argument("rest", nargs=argparse.REMAINDER)
    p.set_defaults(fn=cmd_sandbox)
    from stare.app.sim.command import add_parser as add_sim_parser  # light: heavy imports in its run()

    add_sim_parser(sub)
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
    from stare.app.cli.errors import debug_requested, run_reporting  # a mistake: one line, exit 2

    debug, argv = debug_requested(sys.argv[1:] if argv is None else list(argv))
    args = parse_args(argv)
    return run_reporting(lambda: args.fn(args), debug)
