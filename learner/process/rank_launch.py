"""How `stare learner` becomes several ranks (`system.learner_ranks`, `stare up --learner-ranks`).

Two launchers, one program:
- **Built in** (one node; `stare up`, compose, Kubernetes, Ray): `stare learner` with
  `system.learner_ranks: N` and no WORLD_SIZE in its environment is rank 0. It writes the config it
  runs (model path resolved) to `<run dir>/learner/config.yaml` and starts ranks 1..N-1 as child
  processes of the same command, one per local GPU (`LOCAL_RANK`; CUDA_VISIBLE_DEVICES as given to
  the learner), with a rendezvous on a free loopback port. The children ignore SIGINT/SIGTERM (rank 0
  decides when they stop, after its last checkpoint) and die with rank 0 (PR_SET_PDEATHSIG).
- **External** (several nodes): torchrun or any launcher that sets RANK, LOCAL_RANK, WORLD_SIZE,
  MASTER_ADDR and MASTER_PORT; `model.path` must then be set (every rank loads it) and the
  checkpoint folder shared.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

import yaml

from stare.config import TrainConfig
from stare.observe.files import write_atomic

log = logging.getLogger(__name__)

PARENT_ENV = "STARE_LEARNER_PARENT"  # set on the ranks rank 0 started: its pid
MODEL_ENV, PAD_ENV = "STARE_LEARNER_MODEL", "STARE_LEARNER_PAD_ID"
PR_SET_PDEATHSIG = 1


@dataclass(frozen=True)
class RankInfo:
    rank: int
    world: int
    spawn: bool  # rank 0 of the built-in launcher: start the other ranks

    @property
    def leader(self) -> bool:
        return self.rank == 0


def rank_info(cfg: TrainConfig) -> RankInfo:
    """This process's rank: an external launcher's (WORLD_SIZE set), else rank 0 of
    `system.learner_ranks` (which then starts the others)."""
    if "WORLD_SIZE" in os.environ:
        world = int(os.environ["WORLD_SIZE"])
        if PARENT_ENV not in os.environ and world != cfg.system.learner_ranks and cfg.system.learner_ranks != 1:
            log.warning(
                "WORLD_SIZE=%d from the launcher overrides system.learner_ranks=%d", world, cfg.system.learner_ranks
            )
        return RankInfo(int(os.environ.get("RANK", "0")), world, spawn=False)
    return RankInfo(0, cfg.system.learner_ranks, spawn=cfg.system.learner_ranks > 1)


def rank_timeout_s(cfg: TrainConfig) -> float:
    """How long a rank waits for another: the stall limit, at least a minute."""
    return max(cfg.system.stall_s, 60.0)


def die_with_parent() -> None:
    """A rank rank 0 started: killed when rank 0 dies; the launcher's signals are rank 0's to obey."""
    parent = os.environ.get(PARENT_ENV)
    if parent is None:
        return
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != int(parent):  # rank 0 died before the prctl
        os._exit(1)


class FollowerProcesses:
    """Ranks 1..N-1 as child processes of rank 0 (the built-in launcher)."""

    def __init__(self, cfg: TrainConfig, *, model_path: Path, pad_id: int, name: str):
        from learner.engine.deepspeed_engine import child_env
        from stare.runtime.net import free_port

        world = cfg.system.learner_ranks
        folder = cfg.run_dir / "learner"
        folder.mkdir(parents=True, exist_ok=True)
        config_path = folder / "config.yaml"
        raw = cfg.model_dump(mode="json")
        raw["model"]["path"] = str(model_path)
        write_atomic(config_path, yaml.safe_dump(raw, sort_keys=False))
        rendezvous = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port("127.0.0.1")), "WORLD_SIZE": str(world)}
        os.environ.update(RANK="0", LOCAL_RANK="0", **rendezvous)  # this process: rank 0
        argv = [sys.executable, "-m", "stare.app.cli", "learner", "--config", str(config_path), "--name", name]
        self.procs: dict[int, subprocess.Popen] = {}
        for rank in range(1, world):
            env = {
                **child_env(),
                **rendezvous,
                "RANK": str(rank),
                "LOCAL_RANK": str(rank),
                PARENT_ENV: str(os.getpid()),
                MODEL_ENV: str(model_path),
                PAD_ENV: str(pad_id),
            }
            self.procs[rank] = subprocess.Popen(argv, env=env)
        log.info(
            "started learner ranks 1-%d (pids %s); rendezvous %s:%s",
            world - 1,
            ", ".join(str(p.pid) for p in self.procs.values()),
            rendezvous["MASTER_ADDR"],
            rendezvous["MASTER_PORT"],
        )

    def check(self) -> None:
        """Raise if a follower has exited (the learner must restart as a whole)."""
        for rank, proc in self.procs.items():
            code = proc.poll()
            if code is not None:
                raise RuntimeError(f"learner rank {rank} exited with code {code}; the learner restarts as a whole")

    def stop(self, timeout_s: float) -> None:
        """Wait for the followers (they exit on the stop op), kill those still running."""
        for rank, proc in self.procs.items():
            try:
                proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                log.warning("learner rank %d did not exit within %.0f s; killing it", rank, timeout_s)
                proc.kill()
                proc.wait(timeout=10)


def leave_process_groups() -> None:
    """Destroy this process's groups before it exits: a gloo group torn down by interpreter exit while
    its threads still run aborts the process (`terminate called without an active exception`)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def exit_abandoning_process_groups(code: int) -> NoReturn:
    """Exit now, without tearing the process groups down: after a receive or collective timed out,
    gloo still has the operation pending on its threads, and destroying the group (or letting the
    interpreter do it at exit) can abort the process (SIGABRT) instead of exiting with `code`."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def follower_model(cfg: TrainConfig) -> tuple[Path, int]:
    """A follower's model path and pad id: rank 0's (built-in launcher), else resolved from the config."""
    if MODEL_ENV in os.environ:
        return Path(os.environ[MODEL_ENV]), int(os.environ[PAD_ENV])
    from stare.models.resolve import load_run_setup

    setup = load_run_setup(cfg, log.info)
    return setup.model_path, setup.tokenizer.pad_token_id or 0
