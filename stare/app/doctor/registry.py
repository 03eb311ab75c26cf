"""The doctor's checks: what each verifies, what its failure means and the fix, grouped into the
processes they run in. A group module under stare/app/doctor/checks defines `CHECKS` (these
descriptions, in the order it reports them) and `run(ctx, report)`; `report(row)` is called as soon
as a check ends, so rows done before a group is killed are kept.

Names are `group.check`; `gpu` checks need CUDA (and say what else), the others run on any machine
(the CPU equivalents)."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

Status = Literal["pass", "fail", "skip"]


@dataclass(frozen=True)
class Check:
    name: str  # group.check
    what: str  # what it verifies (one line)
    failure: str  # what a failure means
    fix: str  # what to do about it
    gpu: bool = False  # a GPU check (skipped without CUDA); else it runs on any machine


@dataclass
class Row:
    """One check's result: `why` says what was seen (a skip's reason, a failure's cause); `figures` the
    measurements (numbers, or short strings)."""

    check: str
    status: Status
    why: str = ""
    figures: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Group:
    name: str
    module: str  # stare.app.doctor.checks.<name>: CHECKS and run(ctx, report)
    timeout_s: float  # the whole group, in its own process
    summary: str

    def checks(self) -> list[Check]:
        return list(importlib.import_module(self.module).CHECKS)


@dataclass(frozen=True)
class Context:
    """What every group knows (JSON-serialisable: it crosses into the group's process)."""

    out: str  # the report's folder: groups may leave files there (logs of their subprocesses)
    config: str | None = None  # the run's config (`stare doctor --config`), for config.plan
    overrides: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Context:
        return cls(out=data["out"], config=data.get("config"), overrides=tuple(data.get("overrides", ())))


GROUPS: dict[str, Group] = {
    g.name: g
    for g in (
        Group("environment", "stare.app.doctor.checks.environment", 60, "driver, CUDA, torch, NCCL and the libraries"),
        Group("topology", "stare.app.doctor.checks.topology", 90, "GPUs, P2P/NVLink, NCCL's transport, containers"),
        Group("engine", "stare.app.doctor.checks.engine", 240, "sampling: vLLM (CUDA graphs, sleep, in-flight) or hf"),
        Group("weights", "stare.app.doctor.checks.weights", 120, "weight broadcast and its stream fences"),
        Group("learner", "stare.app.doctor.checks.learner", 300, "a ZeRO-3 step on 2 ranks, a LoRA merge"),
        Group(
            "config",
            "stare.app.doctor.checks.config",
            200,
            "stare plan against this GPU's free memory and a measured step",
        ),
    )
}


def all_checks() -> list[tuple[Group, Check]]:
    return [(g, c) for g in GROUPS.values() for c in g.checks()]


def timed(report: Callable[[Row], None]):
    """A decorator for a check function `fn() -> Row`: its seconds filled in, an exception a failed row."""
    import time
    import traceback

    def wrap(name: str, fn: Callable[[], Row]) -> Row:
        t0 = time.perf_counter()
        try:
            row = fn()
        except Exception as err:
            last = traceback.format_exception_only(type(err), err)[-1].strip()
            row = Row(name, "fail", f"raised {last[:400]}")
        row.seconds = round(time.perf_counter() - t0, 2)
        report(row)
        return row

    return wrap
