"""In-process weight hand-over (embedded mode): the newest state dict, shared by reference."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch


class MemoryWeightBoard:
    """Both ends of the seam in one object: `publish` from the learner, `fetch` from rollout."""

    def __init__(self, copy: bool = True) -> None:
        """`copy` False: keep the published state dict itself, for a publisher that hands over fresh copies
        it never changes (the learner publishing from the host, as a colocated `stare train` on a GPU does:
        no second copy of the weights)."""
        self.version = 0
        self.copy = copy
        self._state: Mapping[str, torch.Tensor] | None = None

    def publish(self, version: int, state_dict: Mapping[str, torch.Tensor]) -> None:
        if version <= self.version and self._state is not None:
            raise ValueError(f"weight version must increase: got {version} after {self.version}")
        self.version = version
        self._state = {k: v.detach().clone() for k, v in state_dict.items()} if self.copy else state_dict

    def fetch(self, have_version: int) -> tuple[int, Mapping[str, torch.Tensor]] | None:
        if self._state is None or self.version <= have_version:
            return None
        return self.version, self._state

    def wait_for(self, min_version: int, timeout_s: float) -> bool:
        return self._state is not None and self.version >= min_version  # one thread: nothing can arrive

    def serve_joiners(self, version: int, state_fn: Callable[[], Mapping[str, torch.Tensor]]) -> bool:
        return False

    def close(self) -> None:
        self._state = None
