"""Reading a verl config for `stare convert-verl`: hydra's YAML and override grammar, verl's
interpolations, and the conversion's bookkeeping (`Conversion`: what was mapped, what was not). The
rules themselves are stare.config.from_verl's."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from stare.config.base import ConfigError
from stare.config.verl_table import MAPPED, NO_DEFAULT

_INTERP = re.compile(r"\$\{([^}]*)\}")


class _HydraLoader(yaml.SafeLoader):  # type: ignore[misc]
    """YAML as OmegaConf reads it: `1e-6` and `1E6` are floats (YAML 1.1 wants `1.0e-6`)."""


_HydraLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(
        r"^(?:[-+]?(?:\d[\d_]*)?\.?\d+[eE][-+]?\d+|[-+]?\d[\d_]*\.\d*(?:[eE][-+]?\d+)?|\.\d+"
        r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"
    ),
    list("-+0123456789."),
)


def parse_value(text: str) -> Any:
    """A hydra override's value."""
    text = text.strip()
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    if text.lower() == "null":
        return None
    try:
        return yaml.load(text, Loader=_HydraLoader)  # a SafeLoader subclass
    except yaml.YAMLError:
        return text


def flatten(node: Any, prefix: str = "") -> dict[str, Any]:
    """{'a': {'b': 1}} -> {'a.b': 1}; lists, scalars and empty mappings are values."""
    if not isinstance(node, dict) or not node:
        return {prefix: node} if prefix else {}
    out: dict[str, Any] = {}
    for key, value in node.items():
        out.update(flatten(value, f"{prefix}.{key}" if prefix else str(key)))
    return out


def read_verl(path: Path | str | None, overrides: list[str] | tuple[str, ...] = ()) -> dict[str, Any]:
    """The verl settings given, flat (dotted keys): a YAML file, then hydra overrides in order."""
    flat: dict[str, Any] = {}
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise ConfigError(f"{path}: no such file; pass a verl YAML config (or only KEY=VALUE overrides)")
        try:
            raw = yaml.load(path.read_text(encoding="utf-8"), Loader=_HydraLoader)
        except yaml.YAMLError as err:
            raise ConfigError(f"{path}: not valid YAML ({str(err).splitlines()[0]})") from None
        if raw is not None and not isinstance(raw, dict):
            raise ConfigError(f"{path}: a verl config is a YAML mapping, got a {type(raw).__name__}")
        flat = flatten({k: v for k, v in (raw or {}).items() if k not in ("defaults", "hydra")})
    for text in overrides:
        text = text.strip()
        if text.startswith("~"):
            key = text[1:].split("=", 1)[0].strip()
            flat = {k: v for k, v in flat.items() if k != key and not k.startswith(key + ".")}
            continue
        if "=" not in text:
            raise ConfigError(f"verl override {text!r}: expected KEY=VALUE (e.g. data.train_batch_size=64)")
        key, value = text.lstrip("+").split("=", 1)
        key = key.strip()
        flat = {k: v for k, v in flat.items() if k != key and not k.startswith(key + ".")}
        flat.update(flatten(parse_value(value), key))
    return flat


@dataclass
class Conversion:
    """What a conversion set, and what it could not."""

    config: dict[str, Any] = field(default_factory=dict)
    mapped: list[tuple[str, str, Any, str]] = field(default_factory=list)  # (verl keys, stare field, value, note)
    unmapped: list[tuple[str, Any, str]] = field(default_factory=list)  # (verl key, its value, why)
    ignored: list[str] = field(default_factory=list)  # verl keys stare has no use for

    def report(self) -> str:
        lines = [f"mapped ({len(self.mapped)}):"]
        lines += [f"  {v} -> {s} = {value!r}" + (f"  ({note})" if note else "") for v, s, value, note in self.mapped]
        lines.append(f"not mapped ({len(self.unmapped)}):")
        lines += [f"  {k} = {value!r}: {why}" for k, value, why in self.unmapped] or ["  (none)"]
        if self.ignored:
            lines.append(f"not needed in stare ({len(self.ignored)}): " + ", ".join(self.ignored))
        return "\n".join(lines)

    def yaml(self) -> str:
        head = ["# converted from a verl config by `stare convert-verl` (docs/from-verl.md)"]
        head += [f"#   {v} -> {s}" for v, s, _, _ in self.mapped]
        if self.unmapped:
            head.append("# not mapped: " + ", ".join(k for k, _, _ in self.unmapped))
        return "\n".join(head) + "\n" + str(yaml.safe_dump(self.config, sort_keys=False))


def matches(key: str, pattern: str) -> bool:
    return key == pattern or (pattern[-1] in "._" and key.startswith(pattern))


class Ctx:
    """The settings being converted (the user's over verl's defaults), what the rules read, what they set."""

    def __init__(self, user: dict[str, Any], verl_defaults: bool):
        self.user = dict(user)
        self.values = {k: d for k, (_, d, _) in MAPPED.items() if d is not NO_DEFAULT} if verl_defaults else {}
        self.values.update(self.user)
        self.out = Conversion()
        self.read: set[str] = set()
        self._resolve()

    def _lookup(self, expr: str) -> Any:
        name, _, arg = expr.partition(":")
        if not arg:
            return self.values.get(expr.strip(), NO_DEFAULT)
        key, _, default = arg.partition(",")
        if name == "oc.env":
            return os.environ.get(key.strip(), parse_value(default) if default else NO_DEFAULT)
        if name == "oc.select":
            return self.values.get(key.strip(), parse_value(default) if default else None)
        return NO_DEFAULT

    def _resolve(self) -> None:
        for _ in range(5):  # interpolations of interpolations
            for key, value in list(self.values.items()):
                if not isinstance(value, str) or "${" not in value:
                    continue
                whole = _INTERP.fullmatch(value.strip())
                if whole:
                    got = self._lookup(whole.group(1))
                    if got is not NO_DEFAULT:
                        self.values[key] = got
                    continue
                parts = {m.group(0): self._lookup(m.group(1)) for m in _INTERP.finditer(value)}
                if all(v is not NO_DEFAULT for v in parts.values()):
                    for text, got in parts.items():
                        value = value.replace(text, str(got))
                    self.values[key] = value

    def given(self, key: str) -> bool:
        return key in self.user

    def get(self, key: str, default: Any = None) -> Any:
        self.read.add(key)
        value = self.values.get(key, default)
        if isinstance(value, str) and "${" in value:
            self.unmapped(key, f"the interpolation {value} could not be resolved; give the value itself")
            return default
        return value

    def set(self, stare: str, value: Any, keys: str, note: str = "") -> None:
        """Set the stare field (dotted) and record what it came from (`keys`: 'a + b')."""
        node = self.out.config
        *parents, leaf = stare.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
        self.record(keys, stare, value, note)

    def record(self, keys: str, stare: str, value: Any, note: str = "") -> None:
        if all(k.strip() not in self.user for k in keys.split("+")):
            note = f"{note}; verl's default" if note else "verl's default"
        self.out.mapped.append((keys, stare, value, note))

    def unmapped(self, key: str, why: str) -> None:
        self.read.add(key)
        if all(k != key for k, _, _ in self.out.unmapped):
            self.out.unmapped.append((key, self.values.get(key), why))
