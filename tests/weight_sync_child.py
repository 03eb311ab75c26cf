"""A learner's weight publisher in a process of its own, for tests where its death is the point.

    python weight_sync_child.py PORT BUCKET_BYTES MESSAGES [REDIS_URL RUN_ID]

It waits for one worker to ask to join, publishes version 1 whole (state(1)), then version 2 (state(2))
but dies (os._exit, as a SIGKILL would leave it) once MESSAGES of version 2's messages were sent and
awaited: the worker has received part of version 2 and never gets the rest. With REDIS_URL and RUN_ID
the publisher announces itself in that run's Redis (stare.weight_sync.rendezvous).
"""

from __future__ import annotations

import itertools
import os
import sys
import time

import torch


def state(version: int) -> dict[str, torch.Tensor]:
    """Large enough for dozens of messages at small buckets; every byte depends on the version."""
    g = torch.Generator().manual_seed(version)
    return {
        "embed.weight": torch.randn(64, 32, generator=g),  # 8 KiB
        "layer.weight": torch.randn(32, 32, generator=g),
        "layer.bias": torch.full((32,), float(version)),
        "head.weight": torch.randn(16, 32, generator=g).to(torch.bfloat16),
    }


def main(argv: list[str]) -> None:
    from stare.weight_sync import broadcast

    port, bucket, cut = int(argv[0]), int(argv[1]), int(argv[2])
    rendezvous = None
    if len(argv) > 3:
        from stare.transport.redis_client import connect_client
        from stare.weight_sync.rendezvous import RedisRendezvous

        rendezvous = RedisRendezvous(connect_client(argv[3]), argv[4])
    pub = broadcast.BroadcastPublisher(
        "127.0.0.1", port, timeout_s=10.0, communicator="gloo", bucket_bytes=bucket, rendezvous=rendezvous
    )
    print(f"port {pub.store.port}", flush=True)
    deadline = time.monotonic() + 60
    while pub.store.add("joins", 0) < 1:
        if time.monotonic() > deadline:
            os._exit(3)
        time.sleep(0.01)
    pub.publish(1, state(1))
    print("sent 1", flush=True)
    sys.stdin.readline()  # the test says when: the worker holds version 1
    send_all = broadcast._send_all

    def send_part_then_die(pg, messages, ranks, lost):
        send_all(pg, itertools.islice(messages, cut), ranks, lost)  # these arrived: awaited
        print("dying", flush=True)
        os._exit(9)

    broadcast._send_all = send_part_then_die
    pub.publish(2, state(2))


if __name__ == "__main__":
    main(sys.argv[1:])
