"""Run a function as N gloo ranks in spawned processes (the data-parallel tests)."""

from __future__ import annotations

import torch.multiprocessing as mp

from stare.runtime.net import free_port


def spawn_ranks(target, world: int, *args, timeout_s: float = 120.0) -> None:
    """`target(rank, world, port, *args)` in `world` processes on one rendezvous port; every one must
    exit 0 within `timeout_s` (one that does not is killed)."""
    ctx = mp.get_context("spawn")
    port = free_port()
    procs = [ctx.Process(target=target, args=(r, world, port, *args)) for r in range(world)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=timeout_s)
        if p.is_alive():
            p.kill()
    assert all(p.exitcode == 0 for p in procs), [p.exitcode for p in procs]
