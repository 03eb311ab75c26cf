"""Reading the files a user hands us (YAML configs, UTF-8 text): a file that cannot be read is a
`FileInputError` naming the file, the 1-based line (and column) where it goes wrong and the fix,
never a bare `yaml.YAMLError` on `<unicode string>` or a `UnicodeDecodeError` without a name.

Line numbers are 1-based everywhere (the convention of editors and of `stare`'s dataset errors).

Numbers: PyYAML reads YAML 1.1, whose floats need a dot (`2e-1` and `1e5` are strings there:
yaml/pyyaml#173); `yaml_loader()` adds YAML 1.2's float form, so a config file and a `--set` value read
`2e-1` as 0.2. A quoted value stays a string.
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path
from typing import Any

# YAML 1.2's float with an exponent, the dot optional (https://yaml.org/spec/1.2.2/#10214-floating-point)
_EXPONENT_FLOAT = re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$")


class FileInputError(ValueError):
    """A user's file that cannot be used; the message names the file, the position and the fix."""


def read_text(path: Path, what: str = "file") -> str:
    """The file's text as UTF-8; a missing or undecodable file is a `FileInputError` with its line."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise FileInputError(f"{path}: no such {what}") from None
    except IsADirectoryError:
        raise FileInputError(f"{path}: is a folder, not a {what}") from None
    except PermissionError:
        raise FileInputError(f"{path}: not readable (permission denied); fix the file's permissions") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data.count(b"\n", 0, err.start) + 1
        column = err.start - (data.rfind(b"\n", 0, err.start) + 1) + 1
        raise FileInputError(
            f"{path} line {line} column {column}: not UTF-8 (byte 0x{data[err.start]:02x}); save the {what} as UTF-8"
        ) from None


@cache
def yaml_loader() -> type:
    """yaml.SafeLoader with YAML 1.2's exponent floats (the module docstring)."""
    import yaml

    class Loader(yaml.SafeLoader):  # type: ignore[misc]
        pass

    Loader.add_implicit_resolver("tag:yaml.org,2002:float", _EXPONENT_FLOAT, list("-+0123456789."))
    return Loader


def load_yaml(text: str) -> Any:
    """`text` parsed as YAML by `yaml_loader()` (raises yaml.YAMLError)."""
    import yaml

    return yaml.load(text, Loader=yaml_loader())  # a SafeLoader subclass


def parse_yaml(text: str, path: Path) -> Any:
    """YAML text of `path`; a syntax error names the file and its 1-based line and column."""
    import yaml

    try:
        return load_yaml(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None) or getattr(err, "context_mark", None)
        where = f"{path} line {mark.line + 1} column {mark.column + 1}" if mark is not None else str(path)
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise FileInputError(f"{where}: invalid YAML ({problem}); fix the syntax there") from None


def read_yaml_mapping(path: Path, what: str = "config file", *, empty: str | None = None) -> dict[str, Any]:
    """A YAML file that holds a mapping at the top level. An empty one (or comments only) is {} when
    `empty` is None, else a FileInputError `FILE: empty (no settings); <empty>` (`empty`: the fix)."""
    raw = parse_yaml(read_text(path, what), path)
    if raw is None:
        if empty is not None:
            raise FileInputError(f"{path}: empty (no settings); {empty}")
        return {}
    if not isinstance(raw, dict):
        raise FileInputError(
            f"{path}: a {what} must hold a YAML mapping (key: value lines) at the top level, not a {type(raw).__name__}"
        )
    return raw
