"""The arguments every `stare` subcommand shares (config, overrides, log format, role flags) and
loading the config from them."""

from __future__ import annotations

import argparse
from pathlib import Path


def default_config_path() -> Path:
    from importlib.resources import files

    return Path(str(files("stare.configs") / "tiny-cpu.yaml"))


def _config_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", type=Path, default=None, help="YAML config (default: the bundled configs/tiny-cpu.yaml)")
    p.add_argument(
        "--algo",
        default=None,
        help="algorithm preset (each one's settings in docs/algorithm.md, Presets; grpo is vanilla GRPO, grpo-matched GRPO on "
        "the config's clip range): stare, grpo, grpo-matched, grpo-ds, dapo, dapo-no-overlong, entropy-bonus, "
        "clip-cov, kl-cov, 80-20",
    )
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config field, e.g. --set optim.lr=1e-5 (repeatable)",
    )
    p.add_argument(
        "--from-verl",
        type=Path,
        default=None,
        metavar="FILE",
        help="a verl config (hydra YAML) translated into stare's (stare convert-verl; docs/from-verl.md), "
        "merged over --config when given (else over stare's defaults); what cannot be mapped is printed first",
    )
    p.add_argument(
        "--verl-set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a verl override as your launch script passes it (data.train_batch_size=64, "
        "+reward_model.overlong_buffer.len=512), translated with --from-verl (repeatable)",
    )


def _log_format_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--log-format",
        choices=["text", "json"],
        default=None,
        help="log lines as text or one JSON object per line for log shippers (default: logging.format)",
    )


def _overrides(args) -> list[str]:
    """--set overrides plus the ones a flag stands for (--log-format)."""
    fmt = getattr(args, "log_format", None)
    return [*args.overrides, *([f"logging.format={fmt}"] if fmt else [])]


def _load(args):
    from stare.config import load_config

    if getattr(args, "from_verl", None) is not None or getattr(args, "verl_set", None):
        return _load_verl(args)
    return load_config(args.config or default_config_path(), algo=args.algo, overrides=_overrides(args))


def _load_verl(args):
    """The config of --from-verl / --verl-set: the conversion (its report on stderr) over --config, if any."""
    import sys

    from stare.config import build_config
    from stare.config.files import read_yaml_mapping
    from stare.config.from_verl import convert_verl, read_verl
    from stare.config.train import deep_merge

    conversion = convert_verl(read_verl(args.from_verl, args.verl_set))
    print(f"stare: from verl: {conversion.report()}", file=sys.stderr, flush=True)
    base = read_yaml_mapping(args.config) if args.config is not None else {}
    return build_config(deep_merge(base, conversion.config), algo=args.algo, overrides=_overrides(args))


def _role_args(p: argparse.ArgumentParser) -> None:
    _config_args(p)
    p.add_argument(
        "--redis-url",
        default=None,
        help="Redis URL (default: STARE_REDIS_URL_FILE's content, else "
        "STARE_REDIS_URL, else system.redis_url; STARE_REDIS_PASSWORD_FILE adds a password). Visible in ps: "
        "prefer --redis-url-file",
    )
    p.add_argument("--redis-url-file", default=None, help="file holding the Redis URL with its password (a secret)")
    p.add_argument(
        "--name",
        default=None,
        help="worker name, also its stream consumer name (default: STARE_WORKER_NAME, else ROLE-HOST-PID); "
        "'{slot}' in it takes the lowest free replica slot (stare/runtime/process.py)",
    )
    _log_format_arg(p)
