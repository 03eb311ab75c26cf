"""Weight broadcast: stare's BroadcastPublisher vs a raw torch.distributed broadcast loop.

A decoder-LM-shaped fp32 state dict (embedding, 6 layers of attention + MLP, norms; 100M
parameters = 381 MiB by default) sent from one learner process to N receiver processes on this
machine over gloo (loopback), both modes in the same run:
  * raw:   `init_process_group("gloo")` once, then per version `dist.broadcast(t, 0)` for every
           tensor in turn (the obvious loop), receivers into preallocated tensors; the sender is a
           process of its own, like the receivers;
  * stare: `BroadcastPublisher.publish` (TCPStore rendezvous, a gloo group formed at run time,
           stare/weight_sync/broadcast.py) to `BroadcastSubscriber`s (background receiver
           threads; the receiver process takes the new version with `fetch`).
Each timed round ends when every receiver has the whole version in hand and said so through a
TCPStore key (the same acknowledgement in both modes). Both modes' processes are up at once and
their rounds alternate (raw, stare, then stare, raw, ...), the idle mode's processes blocked (gloo
receive, store wait) while the other sends, so that the machine's load drifting over the run hits
both alike: one uncounted warm-up round of each first (it forms the groups), then `--rounds`
timed pairs. Ratio = the median over pairs of stare throughput / raw throughput (target >= 0.95);
ours and baseline are each mode's median GB/s, the spread the range of the per-pair ratios.
Every process runs one torch thread.

Usage: python stare/app/bench/bench_broadcast.py [--receivers 2] [--rounds 5] [--params-m 100]
(or `stare bench broadcast`)
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import sys
import time
from datetime import timedelta
from typing import Any

from stare.app.bench.common import format_table, paired_row

TIMEOUT_S = 300.0
TARGET = 0.95
QUICK = dict(params_m=100.0, receivers=2, rounds=15)
FULL = dict(params_m=100.0, receivers=2, rounds=31)


def make_state(params_m: float):
    """A decoder-LM-shaped state dict of about params_m million fp32 parameters."""
    import torch

    hidden, layers = 1024, 6
    if params_m < 40:  # small sizes (tests): a narrower model of the same shape
        hidden, layers = 128, 2
    ffn = hidden * 11 // 4
    per_layer = 4 * hidden * hidden + 3 * hidden * ffn + 2 * hidden
    vocab = max(int((params_m * 1e6 - layers * per_layer - hidden) / hidden), 1000)
    g = torch.Generator().manual_seed(0)
    state = {"model.embed_tokens.weight": torch.randn(vocab, hidden, generator=g)}
    for i in range(layers):
        p = f"model.layers.{i}."
        for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
            state[p + f"self_attn.{name}.weight"] = torch.randn(hidden, hidden, generator=g)
        state[p + "mlp.gate_proj.weight"] = torch.randn(ffn, hidden, generator=g)
        state[p + "mlp.up_proj.weight"] = torch.randn(ffn, hidden, generator=g)
        state[p + "mlp.down_proj.weight"] = torch.randn(hidden, ffn, generator=g)
        state[p + "input_layernorm.weight"] = torch.ones(hidden)
        state[p + "post_attention_layernorm.weight"] = torch.ones(hidden)
    state["model.norm.weight"] = torch.ones(hidden)
    return state


def _quiet() -> None:
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")  # no c10d warning per 1 s store-wait slice


def _ack_store(port: int, master: bool):
    import torch.distributed as dist

    return dist.TCPStore(
        "127.0.0.1", port, is_master=master, wait_for_workers=False, timeout=timedelta(seconds=TIMEOUT_S)
    )


def _await_acks(acks, mode: str, r: int, world: int) -> None:
    acks.wait([f"ack/{mode}/{r}/{rank}" for rank in range(1, world)], timedelta(seconds=TIMEOUT_S))


def raw_sender(world: int, pg_port: int, ack_port: int, params_m: float, rounds: int) -> None:
    """Round r starts when the main process sets `go/raw/<r>`; its time (broadcast until every
    receiver acknowledged) goes back as `time/raw/<r>`."""
    _quiet()
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    state = make_state(params_m)
    acks = _ack_store(ack_port, False)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{pg_port}", rank=0, world_size=world, timeout=timedelta(seconds=TIMEOUT_S)
    )
    for r in range(rounds + 1):
        acks.wait([f"go/raw/{r}"], timedelta(seconds=TIMEOUT_S))
        t0 = time.perf_counter()
        for t in state.values():
            dist.broadcast(t, 0)
        _await_acks(acks, "raw", r, world)
        acks.set(f"time/raw/{r}", repr(time.perf_counter() - t0))
    dist.destroy_process_group()


def raw_receiver(rank: int, world: int, pg_port: int, ack_port: int, params_m: float, rounds: int) -> None:
    _quiet()
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    buffers = {k: torch.empty_like(v) for k, v in make_state(params_m).items()}
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{pg_port}",
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=TIMEOUT_S),
    )
    acks = _ack_store(ack_port, False)
    for r in range(rounds + 1):
        for t in buffers.values():
            dist.broadcast(t, 0)
        acks.set(f"ack/raw/{r}/{rank}", "1")
    dist.destroy_process_group()


def stare_receiver(rank: int, world: int, pub_port: int, ack_port: int, params_m: float, rounds: int) -> None:
    _quiet()
    import torch

    from stare.weight_sync.broadcast import BroadcastSubscriber

    torch.set_num_threads(1)
    sub = BroadcastSubscriber("127.0.0.1", pub_port, f"r{rank}", timeout_s=TIMEOUT_S, poll_s=0.001)
    acks = _ack_store(ack_port, False)
    for r in range(rounds + 1):
        if not sub.wait_for(r + 1, TIMEOUT_S):
            raise TimeoutError(f"receiver {rank}: version {r + 1} never arrived")
        version, state = sub.fetch(r)
        assert version == r + 1 and len(state) > 0
        acks.set(f"ack/stare/{r}/{rank}", "1")
    sub.close()


def _join(procs, what: str) -> None:
    for p in procs:
        p.join(timeout=60)
    bad = [p.exitcode for p in procs if p.exitcode != 0]
    for p in procs:
        if p.is_alive():
            p.kill()
    if bad:
        raise RuntimeError(f"{what}: a process exited with {bad}")


def bench_interleaved(state, receivers: int, rounds: int, params_m: float) -> dict[str, list[float]]:
    """Seconds per round of each mode ("raw", "stare"), `rounds` each after one warm-up round each;
    the modes alternate round by round, rotating which goes first."""
    from stare.runtime.net import free_port
    from stare.weight_sync.broadcast import BroadcastPublisher

    world, pg_port, pub_port, ack_port = receivers + 1, free_port(), free_port(), free_port()
    acks = _ack_store(ack_port, True)
    pub = BroadcastPublisher("127.0.0.1", pub_port, timeout_s=TIMEOUT_S)
    ctx = mp.get_context("spawn")
    procs = [
        ctx.Process(target=raw_receiver, args=(rank, world, pg_port, ack_port, params_m, rounds))
        for rank in range(1, world)
    ]
    procs.append(ctx.Process(target=raw_sender, args=(world, pg_port, ack_port, params_m, rounds)))
    procs += [
        ctx.Process(target=stare_receiver, args=(rank, world, pub_port, ack_port, params_m, rounds))
        for rank in range(1, world)
    ]
    for p in procs:
        p.start()

    def raw_round(r: int) -> float:
        acks.set(f"go/raw/{r}", "1")
        acks.wait([f"time/raw/{r}"], timedelta(seconds=TIMEOUT_S))
        return float(acks.get(f"time/raw/{r}"))

    def stare_round(r: int) -> float:
        t0 = time.perf_counter()
        pub.publish(r + 1, state)
        _await_acks(acks, "stare", r, world)
        return time.perf_counter() - t0

    try:
        deadline = time.monotonic() + TIMEOUT_S
        while pub.store.add("joins", 0) < receivers:  # everyone asked to join before the warm-up round
            if time.monotonic() > deadline:
                raise TimeoutError("receivers never asked to join")
            time.sleep(0.01)
        times: dict[str, list[float]] = {"raw": [], "stare": []}
        arms = {"raw": raw_round, "stare": stare_round}
        for r in range(rounds + 1):  # round 0: the warm-up of each mode, uncounted
            order = ("raw", "stare") if r % 2 == 0 else ("stare", "raw")
            for mode in order:
                seconds = arms[mode](r)
                if r:
                    times[mode].append(seconds)
        if pub.failures:
            raise RuntimeError(f"{pub.failures} broadcasts failed")
    finally:
        _join(procs, "broadcast")
        pub.close()
    return times


def measure(*, params_m: float, receivers: int, rounds: int) -> list[dict[str, Any]]:
    """One row: BroadcastPublisher's GB/s over the raw loop's, from interleaved rounds (the module
    docstring)."""
    _quiet()
    import torch

    torch.set_num_threads(1)
    state = make_state(params_m)
    n_bytes = sum(t.numel() * t.element_size() for t in state.values())
    n_params = sum(t.numel() for t in state.values())
    times = bench_interleaved(state, receivers, rounds, params_m)
    ours, raw = times["stare"], times["raw"]
    return [
        paired_row(
            "broadcast",
            f"BroadcastPublisher vs raw gloo dist.broadcast loop, {n_params / 1e6:.0f}M fp32 "
            f"params ({n_bytes / 2**20:.0f} MiB) to {receivers} receiver(s), rounds interleaved",
            [n_bytes / t / 1e9 for t in ours],
            [n_bytes / t / 1e9 for t in raw],
            unit="GB/s",
            target=TARGET,
            seconds={"ours_s": ours, "baseline_s": raw},
        )
    ]


def run(quick: bool) -> list[dict[str, Any]]:
    return measure(**(QUICK if quick else FULL))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--receivers", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=QUICK["rounds"])
    parser.add_argument("--params-m", type=float, default=100.0)
    args = parser.parse_args(argv)
    rows = measure(params_m=args.params_m, receivers=args.receivers, rounds=args.rounds)
    print(
        f"{args.rounds} interleaved rounds of each mode after 1 warm-up each; ours = BroadcastPublisher, "
        f"baseline = raw loop; ratio = median of the per-round throughput ratios"
    )
    print(format_table(rows))
    print("seconds per round: " + ", ".join(f"{k} {statistics.median(v):.3f}" for k, v in rows[0]["seconds"].items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
