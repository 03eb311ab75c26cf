"""The weight-sync protocol."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol

import torch


class WeightPublisher(Protocol):
    def publish(self, version: int, state_dict: Mapping[str, torch.Tensor]) -> None:
        """Make `version` available to every subscriber; versions only increase."""
        ...

    def serve_joiners(self, version: int, state_fn: Callable[[], Mapping[str, torch.Tensor]]) -> bool:
        """Between steps: hand `version` (its weights from `state_fn()`, called only if needed) to
        subscribers that joined since the last publish; True if any did."""
        ...

    def close(self) -> None: ...


class WeightSubscriber(Protocol):
    def fetch(self, have_version: int) -> tuple[int, Mapping[str, torch.Tensor]] | None:
        """The newest weights if newer than `have_version` (a worker that missed versions jumps to
        the newest), else None."""
        ...

    def wait_for(self, min_version: int, timeout_s: float) -> bool:
        """Block until a version >= min_version is available (True) or timeout_s passed (False)."""
        ...

    def close(self) -> None: ...


def publisher_metrics(publisher: object) -> dict[str, Any]:
    """What a step's metrics say of the weight sync: failed syncs so far, the last whole sync's time (for a
    background publisher the step's publish is only the hand-off) and the members of the broadcast group."""
    return {
        "weight_sync_failures": getattr(publisher, "failures", 0),
        "time_weight_sync_s": getattr(publisher, "last_sync_s", None),
        "weight_sync_members": len(getattr(publisher, "alive_members", [])),
    }
