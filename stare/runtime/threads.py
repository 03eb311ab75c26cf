"""`run.threads` against the machine: at most the CPUs this process may run on (os.sched_getaffinity: a
container's or taskset's cpuset, not the host's count). More threads than that only contend, and torch
aborts (a segfault) when the OS refuses to start that many. Checked before a run starts (a ConfigError
naming the field) and where torch's thread count is set."""

from __future__ import annotations

import os

from stare.config import ConfigError, TrainConfig


def usable_cpus() -> int:
    """CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1


def check_threads(cfg: TrainConfig) -> None:
    threads, cpus = cfg.run.threads, usable_cpus()
    if threads is not None and threads > cpus:
        raise ConfigError(
            f"run.threads={threads}: this machine lets stare run on {cpus} CPUs; set run.threads to at most "
            f"{cpus} (or leave it unset for torch's default)"
        )


def apply_threads(cfg: TrainConfig) -> None:
    """torch's intra-op threads from run.threads (checked first); nothing when it is unset."""
    check_threads(cfg)
    if cfg.run.threads is not None:
        import torch

        torch.set_num_threads(cfg.run.threads)
