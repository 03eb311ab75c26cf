"""Config errors a reader can act on: "did you mean" for an unknown key (difflib over the known fields,
walking the config's sections and its discriminated unions), verl's name answered with stare's (the
converter's table), and the offending value shown short: never the whole config or a whole section.

`explain(root, error)` turns one pydantic error (an item of `ValidationError.errors()`) into a line.
"""

from __future__ import annotations

import difflib
import types
import typing
from typing import Any

from pydantic import BaseModel

VERL_ROOTS = ("actor_rollout_ref", "algorithm", "critic", "custom_reward_function", "reward_model", "trainer")
SKIP_LOC = ("function-after", "tagged-union", "function-before")


def _models(annotation: Any) -> list[type[BaseModel]]:
    """The pydantic models a field's annotation can hold (through Optional, unions, Annotated, containers)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _models(typing.get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType, list, tuple, dict):
        return [m for arg in typing.get_args(annotation) for m in _models(arg)]
    return []


def _tag(model: type[BaseModel]) -> str | None:
    """A union member's tag (its literal `name` or `kind`), None for a plain section."""
    for name in ("name", "kind"):
        f = model.model_fields.get(name)
        if f is not None and typing.get_origin(f.annotation) is typing.Literal and isinstance(f.default, str):
            return f.default
    return None


def walk(root: type[BaseModel], parts: list[str]) -> tuple[list[str], list[type[BaseModel]]]:
    """(the location without union tags and list indices, the models of its last section)."""
    models, shown = [root], []
    for part in parts:
        tagged = [m for m in models if _tag(m) == part]
        if tagged:  # pydantic puts a union member's tag in the location: not a key the user wrote
            models = tagged
            continue
        if part.isdigit():
            shown.append(f"[{part}]")
            continue
        shown.append(part)
        models = [sub for m in models if part in m.model_fields for sub in _models(m.model_fields[part].annotation)]
    return shown, models


def dotted(parts: list[str]) -> str:
    return ".".join(parts).replace(".[", "[")


def all_fields(root: type[BaseModel], prefix: str = "", depth: int = 0) -> list[str]:
    """Every dotted field of the config (a union: each member's fields)."""
    out = []
    for name, f in root.model_fields.items():
        out.append(prefix + name)
        if depth < 4:
            for sub in _models(f.annotation):
                out += all_fields(sub, f"{prefix}{name}.", depth + 1)
    return sorted(set(out))


def _leaves(value: Any, prefix: str) -> list[str]:
    if isinstance(value, dict) and value:
        return [leaf for k, v in value.items() for leaf in _leaves(v, f"{prefix}.{k}")]
    return [prefix]


def _verl_hint(keys: list[str]) -> str | None:
    from stare.config.verl_table import MAPPED

    for key in keys:
        if key in MAPPED:
            stare, _, note = MAPPED[key]
            where = f"stare's {stare}" if stare else note
            return (
                f"{key} is a verl setting ({where}); `stare convert-verl` translates verl configs (docs/from-verl.md)"
            )
    if keys and keys[0].split(".", 1)[0] in VERL_ROOTS:
        return f"{keys[0]} is a verl setting; `stare convert-verl` translates verl configs (docs/from-verl.md)"
    return None


def _closest(word: str, candidates: list[str], cutoff: float) -> str | None:
    """difflib's closest, or a candidate the word abbreviates (gpu_mem -> gpu_memory_utilization)."""
    close = difflib.get_close_matches(word, candidates, n=1, cutoff=cutoff)
    if close:
        return close[0]
    longer = sorted(c for c in candidates if len(word) >= 4 and c.startswith(word))
    return longer[0] if longer else None


def suggest(root: type[BaseModel], parts: list[str], value: Any = None) -> str | None:
    """What the unknown key at `parts` probably meant: a verl setting's stare field, the closest field of
    its section (of any member of a union: the engine, the loss), else the same name in another section
    (run.lr -> optim.lr); None when nothing is close."""
    shown, _ = walk(root, parts)
    hint = _verl_hint(_leaves(value, dotted(shown)))
    if hint is not None:
        return hint
    _, parents = walk(root, [p for p in parts[:-1] if not any(_tag(m) == p for m in _union_members(root, parts))])
    siblings = sorted({f for m in parents for f in m.model_fields})
    close = _closest(parts[-1], siblings, 0.6)
    if close is not None:
        return f"did you mean {dotted([*shown[:-1], close])}?"
    fields = all_fields(root)
    leaf = _closest(parts[-1], sorted({f.rsplit(".", 1)[-1] for f in fields}), 0.8)
    anywhere = [f for f in fields if leaf is not None and f.rsplit(".", 1)[-1] == leaf]
    return f"did you mean {anywhere[0]}?" if anywhere else None


def _union_members(root: type[BaseModel], parts: list[str]) -> list[type[BaseModel]]:
    """Every model met along `parts` (to tell a union tag in the location from a key)."""
    models, seen = [root], [root]
    for part in parts:
        nxt = [sub for m in models if part in m.model_fields for sub in _models(m.model_fields[part].annotation)]
        models = nxt or models
        seen += nxt
    return seen


def short(value: Any, limit: int = 80) -> str:
    """A value as an error line shows it: scalars as they are (cut at `limit`), sections by their size."""
    if isinstance(value, dict):
        return f"a section of {len(value)} key{'s' * (len(value) != 1)}"
    if isinstance(value, (list, tuple)) and any(isinstance(v, (dict, list)) for v in value):
        return f"a list of {len(value)}"
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def explain(root: type[BaseModel], error: Any, origin: str = "") -> str:
    """One pydantic error as a line: the field (union tags left out), the message, the value (short) and
    where it came from (`origin`: "in FILE", "from --set ..."), and for an unknown key what it probably
    meant."""
    parts = [str(p) for p in error["loc"] if not str(p).startswith(SKIP_LOC)]
    shown, _ = walk(root, parts)
    line = f"{dotted(shown) or '(root)'}: {error['msg']}"
    value = error.get("input")
    where = f", {origin}" if origin else ""
    if error["type"] == "extra_forbidden" and parts:
        hint = suggest(root, parts, value)
        return f"{line} (got {short(value)}{where})" + (f"; {hint}" if hint else "")
    if not (error["type"].startswith("value_error") and isinstance(value, dict)):  # a validator's: no dump
        return f"{line} (got {short(value)}{where})"
    return f"{line} ({origin})" if origin else line
