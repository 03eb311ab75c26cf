"""Render the config reference (docs/config.md) from the pydantic models, so it cannot go stale.

`python -m stare.config.docs > docs/config.md`; a test compares the committed file with this output.
"""

from __future__ import annotations

import typing
from collections.abc import Set

from pydantic import BaseModel
from pydantic.fields import FieldInfo

from stare.config import ALGO_PRESETS, ENGINE_SECTIONS, TrainConfig
from stare.config.algo import LOSS_CONFIGS, GrpoLossConfig


def _bounds(field: FieldInfo) -> str:
    parts = []
    for m in field.metadata:
        for name, sym in (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<")):
            if getattr(m, name, None) is not None:
                parts.append(f"{sym} {getattr(m, name)}")
    return ", ".join(parts)


def _type(annotation: object) -> str:
    text = getattr(annotation, "__name__", None) if not typing.get_args(annotation) else None
    return text or str(annotation).replace("typing.", "").replace("pathlib.", "")


def _table(model: type[BaseModel], prefix: str, skip: Set[str] = frozenset()) -> list[str]:
    rows = ["| field | type | default | bounds | meaning |", "| --- | --- | --- | --- | --- |"]
    for name, field in model.model_fields.items():
        if name in skip:
            continue
        if name == "engine" and prefix == "rollout.":  # a union: its tables follow the section's
            continue
        if isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel):  # nested: one row per leaf
            rows += _table(field.annotation, f"{prefix}{name}.")[2:]
            continue
        values = typing.get_args(field.annotation)
        if (
            typing.get_origin(field.annotation) is dict
            and isinstance(values[-1], type)
            and issubclass(values[-1], BaseModel)
        ):
            # a mapping of sections (e.g. task.eval_sources): its row, then one row per leaf of one entry
            desc = (field.description or "").replace("|", "\\|").replace("\n", " ")
            default = repr(field.get_default(call_default_factory=True))
            rows.append(f"| `{prefix}{name}` | `dict[str, {values[-1].__name__}]` | `{default}` | | {desc} |")
            rows += _table(values[-1], f"{prefix}{name}.<key>.")[2:]
            continue
        optional = [a for a in values if isinstance(a, type) and issubclass(a, BaseModel)]
        if optional:  # an optional section: its own row (null = off), then one row per leaf
            desc = (field.description or "").replace("|", "\\|").replace("\n", " ")
            rows.append(f"| `{prefix}{name}` | `{optional[0].__name__} or null` | `None` | | {desc} |")
            rows += _table(optional[0], f"{prefix}{name}.")[2:]
            continue
        default = "(required)" if field.is_required() else repr(field.get_default(call_default_factory=True))
        desc = (field.description or "").replace("|", "\\|").replace("\n", " ")
        rows.append(f"| `{prefix}{name}` | `{_type(field.annotation)}` | `{default}` | {_bounds(field)} | {desc} |")
    return rows


def render() -> str:
    out = [
        "# Config reference",
        "",
        "Generated from the pydantic models by `python -m stare.config.docs` (a test keeps it in sync).",
        "Set any field in YAML or with `--set section.field=value`; values are parsed as YAML.",
        "",
        f"`--algo` presets: {', '.join(f'`{a}`' for a in ALGO_PRESETS)}.",
        "",
    ]
    for name, field in TrainConfig.model_fields.items():
        section = field.annotation
        if name == "loss":
            out += ["## loss", "", "A discriminated union on `loss.name`; the surrogate fields are shared.", ""]
            out += _table(GrpoLossConfig, "loss.", skip={"name"}) + [""]
            for cls in LOSS_CONFIGS.values():
                extra = set(cls.model_fields) - set(GrpoLossConfig.model_fields)
                if extra:
                    out += [f"### loss.name: {cls.model_fields['name'].default}", ""]
                    out += _table(cls, "loss.", skip=set(cls.model_fields) - extra) + [""]
            continue
        if isinstance(section, type) and issubclass(section, BaseModel):
            out += [f"## {name}", "", *_table(section, f"{name}."), ""]
            if name == "rollout":  # the engine union: one table per engine
                out += [
                    "A discriminated union on `rollout.engine.name` (`rollout.engine: vllm` is short for "
                    "`rollout.engine: {name: vllm}`).",
                    "",
                ]
                for engine_name, engine_cls in ENGINE_SECTIONS.items():
                    out += [
                        f"### rollout.engine.name: {engine_name}",
                        "",
                        *_table(engine_cls, "rollout.engine.", skip={"name"}),
                        "",
                    ]
        else:
            out += [f"## {name}", "", field.description or "", ""]
    return "\n".join(out)


if __name__ == "__main__":
    print(render())
