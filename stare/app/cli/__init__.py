"""The `stare` command (`python -m stare.app.cli`). `parser` builds the command line, `commands` holds
what each subcommand does (heavy imports inside, so `--help` is instant), `args` the shared
arguments and config loading, `ctl` the control-plane client (`stare ctl`)."""

from stare.app.cli.args import _config_args, _load, _overrides, default_config_path
from stare.app.cli.parser import build_parser, main, parse_args

__all__ = ["_config_args", "_load", "_overrides", "build_parser", "default_config_path", "main", "parse_args"]
