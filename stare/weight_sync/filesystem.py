"""Weight hand-over through a shared folder: safetensors files, the version pointer in Redis.

The learner writes `<dir>/v<version>/model.safetensors` into a temporary folder and renames it
into place (readers never see a half-written version), then sets the pointer
`stare:{run_id}:weights` (a hash: version, path). Workers poll the pointer between batches and
load the newest version (one that missed versions jumps to it). The newest `keep` versions stay
on disk; older ones are removed, never the one the pointer names. Works across nodes when the
folder is a shared volume (NFS, a ReadWriteMany PVC).
"""

from __future__ import annotations

import logging
import shutil
import time
from collections.abc import Callable, Mapping
from pathlib import Path

import redis
import torch
from safetensors.torch import load_file, save_file

from stare.transport.redis_client import retrying, run_key
from stare.transport.redis_dead_letters import as_str

log = logging.getLogger(__name__)

FILE = "model.safetensors"


def version_dir(root: Path, version: int) -> Path:
    return root / f"v{version:08d}"


def _unshared(state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """CPU tensors with no two sharing storage (safetensors refuses tied weights): the second name
    of a shared storage gets a copy."""
    out, seen = {}, set()
    for name, value in state_dict.items():
        t = value.detach().cpu().contiguous()
        ptr = t.untyped_storage().data_ptr()
        out[name] = t.clone() if ptr in seen else t
        seen.add(ptr)
    return out


class FilesystemPublisher:
    def __init__(self, client: redis.Redis, run_id: str, root: Path, *, keep: int = 3):
        if keep < 2:
            raise ValueError(f"keep={keep} must be >= 2, so a worker loading the previous version still finds it")
        self.client, self.root, self.keep = client, Path(root), keep
        self.key = run_key(run_id, "weights")
        self.root.mkdir(parents=True, exist_ok=True)
        self.version = -1

    def publish(self, version: int, state_dict: Mapping[str, torch.Tensor]) -> None:
        if version <= self.version:
            raise ValueError(f"weight version must increase: got {version} after {self.version}")
        final = version_dir(self.root, version)
        tmp = self.root / f".tmp-v{version:08d}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        save_file(_unshared(state_dict), str(tmp / FILE), metadata={"version": str(version)})
        shutil.rmtree(final, ignore_errors=True)
        tmp.rename(final)
        retrying(
            lambda: self.client.hset(self.key, mapping={"version": version, "path": str(final / FILE)}),
            f"HSET {self.key}",
        )
        self.version = version
        self._prune()

    def serve_joiners(self, version: int, state_fn: Callable[[], Mapping[str, torch.Tensor]]) -> bool:
        return False  # workers read the pointer themselves

    def close(self) -> None:
        pass

    def _prune(self) -> None:
        versions = sorted(p for p in self.root.glob("v*") if p.is_dir())
        for old in versions[: -self.keep]:
            shutil.rmtree(old, ignore_errors=True)


class FilesystemSubscriber:
    def __init__(self, client: redis.Redis, run_id: str, *, poll_s: float = 0.2):
        self.client, self.poll_s = client, poll_s
        self.key = run_key(run_id, "weights")

    def latest_version(self) -> int:
        raw = retrying(lambda: self.client.hget(self.key, "version"), f"HGET {self.key}")
        return -1 if raw is None else int(raw)

    def fetch(self, have_version: int) -> tuple[int, Mapping[str, torch.Tensor]] | None:
        for _ in range(3):
            pointer = retrying(lambda: self.client.hgetall(self.key), f"HGETALL {self.key}")
            if not pointer or int(pointer[b"version"]) <= have_version:
                return None
            version, path = int(pointer[b"version"]), as_str(pointer[b"path"])
            try:
                return version, load_file(path)
            except FileNotFoundError:  # pruned between the read and the load: a newer one is there
                log.info("weights v%d at %s were replaced while loading; reading the pointer again", version, path)
        raise RuntimeError(f"weights under {self.key} keep changing faster than they load; raise the publisher's keep")

    def wait_for(self, min_version: int, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while self.latest_version() < min_version:
            if time.monotonic() >= deadline:
                return False
            time.sleep(self.poll_s)
        return True

    def close(self) -> None:
        pass
