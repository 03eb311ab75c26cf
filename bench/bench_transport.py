"""RedisStream vs raw redis-py on the same bytes, same Redis, same run.

Moves realistic trajectories (256 prompt tokens; 1k and 8k response tokens; packed int32 ids,
float32 log-probs, uint8 mask, ~3 characters of text per token) through one stream and its
consumer group, in batches (publish, then consume + ack):
  * raw redis-py:  pipelined XADD (MAXLEN ~), XREADGROUP + XACK; no record objects;
  * RedisStream:   `publish` (pipelined XADD MAXLEN ~ and an XINFO GROUPS backlog check),
                   `consume` (XREADGROUP, decode, in-flight bookkeeping), `ack` (XACK); a new
                   consumer's one read of its own pending entries is start-up, untimed like
                   raw's XGROUP CREATE;
  both twice: on already-encoded bytes (a pass-through codec: the transport's own cost), and with
  the Trajectory codec (`to_fields` on publish, `from_fields` + validation on consume), which a
  real producer/consumer pays whatever the transport.
Rounds alternate between modes (rotating which goes first, after one uncounted warm-up round;
each timed with the garbage collector off, as timeit does);
each cell is the median over rounds, the ratio the median over rounds of RedisStream's throughput
over raw redis-py's doing the same codec work (target >= 0.95). Redis (a throwaway redis-server on a free port) runs
without AOF by default, to time the transport rather than the disk (`--aof`: appendfsync everysec).

Usage: python bench/bench_transport.py [--url redis://...] [--rounds 21] [--batch 64] [--mb 48] [--aof]
(or `stare bench transport`)
"""

from __future__ import annotations

import argparse
import gc
import tempfile
import time
from pathlib import Path
from typing import Any

from stare.bench.common import format_table, paired_row

TARGET = 0.95
QUICK = dict(rounds=21, batch=64, mb=48.0)
FULL = dict(rounds=31, batch=64, mb=96.0)


class Encoded:
    """A pass-through codec: the record is its fields (bytes in, bytes out)."""

    def __init__(self, fields: dict):
        self.fields = fields

    def to_fields(self) -> dict:
        return self.fields

    @classmethod
    def from_fields(cls, data: dict) -> "Encoded":
        return cls(data)


def make_trajectories(n: int, response_tokens: int, prompt_tokens: int = 256):
    import numpy as np

    from stare.records import Trajectory

    rng = np.random.default_rng(0)
    out = []
    for i in range(n):
        out.append(Trajectory(
            run_id="bench", trajectory_id=f"{i:08x}", group_id=f"g{i // 8}", group_size=8, weight_version=3,
            prompt_token_ids=rng.integers(0, 150_000, prompt_tokens, dtype=np.int32),
            response_token_ids=rng.integers(0, 150_000, response_tokens, dtype=np.int32),
            response_logprobs=-rng.exponential(1.0, response_tokens).astype(np.float32),
            loss_mask=np.ones(response_tokens, dtype=np.uint8), finish_reason="length", answer="42",
            problem_id=f"p{i // 8}", data_source="bench", response_text="x" * (response_tokens * 3),
            reward=1.0, reward_info={"correct": True},
        ))
    return out


def run_ours(client, run_id: str, records, codec, batch: int) -> tuple[float, float]:
    from stare.transport.redis_streams import RedisStream

    n = len(records)
    s = RedisStream(client, run_id, "scored", codec, group="learner", maxlen=2 * n, max_backlog=n)
    s.consume("l", batch)  # start-up, untimed like raw's XGROUP CREATE: a new consumer's one read of its own pending entries
    t0 = time.perf_counter()
    for a in range(0, n, batch):
        s.publish(records[a:a + batch])
    t1 = time.perf_counter()
    got = 0
    while got < n:
        deliveries = s.consume("l", batch)
        s.ack([d.id for d in deliveries])
        got += len(deliveries)
    t2 = time.perf_counter()
    client.delete(s.key)
    return t1 - t0, t2 - t1


def run_raw(client, run_id: str, records, codec, batch: int) -> tuple[float, float]:
    n = len(records)
    key = f"stare:{run_id}:stream:scored"
    client.xgroup_create(key, "learner", id="0", mkstream=True)
    t0 = time.perf_counter()
    for a in range(0, n, batch):
        pipe = client.pipeline(transaction=False)
        for r in records[a:a + batch]:
            pipe.xadd(key, r.to_fields(), maxlen=2 * n, approximate=True)
        pipe.execute()
    t1 = time.perf_counter()
    got = 0
    while got < n:
        reply = client.xreadgroup("learner", "l", {key: ">"}, count=batch)
        entries = reply[0][1]
        decoded = [codec.from_fields(f) for _, f in entries]  # noqa: F841 (what a consumer needs)
        client.xack(key, "learner", *[i for i, _ in entries])
        got += len(entries)
    t2 = time.perf_counter()
    client.delete(key)
    return t1 - t0, t2 - t1


def without_gc(fn, *args):
    """`fn(*args)` with the cyclic garbage collector off (as timeit does), after a collection: a
    gen-2 pass over the round's records would land in whichever arm it happens to, adding noise,
    not cost (cycles left by an arm are collected before the next one)."""
    gc.collect()
    gc.disable()
    try:
        return fn(*args)
    finally:
        gc.enable()


def measure_on(url: str, *, rounds: int, batch: int, mb: float, sizes=(1024, 8192)) -> list[dict[str, Any]]:
    """One row per (response size, codec, direction): RedisStream's records/s over raw redis-py's."""
    import redis

    from stare.records import Trajectory

    client = redis.Redis.from_url(url, socket_timeout=30, socket_connect_timeout=5)
    rows = []
    try:
        for tokens in sizes:
            records = make_trajectories(max(batch, 8), tokens)
            size = sum(len(v) for v in records[0].to_fields().values())
            n = max(batch, int(mb * 1e6 / size) // batch * batch)
            records = make_trajectories(n, tokens)
            encoded = [Encoded(r.to_fields()) for r in records]
            cases = {("bytes", "raw"): (run_raw, encoded, Encoded), ("bytes", "ours"): (run_ours, encoded, Encoded),
                     ("Trajectory", "raw"): (run_raw, records, Trajectory),
                     ("Trajectory", "ours"): (run_ours, records, Trajectory)}
            times: dict[tuple[str, str], list[tuple[float, float]]] = {c: [] for c in cases}
            order = list(cases)
            for r in range(-1, rounds):  # round -1 warms Redis' allocator up and is not counted
                for case in order[r % len(order):] + order[:r % len(order)]:  # rotate: no mode always first
                    fn, recs, codec = cases[case]
                    t = without_gc(fn, client, f"bench-{case[1]}-{case[0]}-{r}", recs, codec, batch)
                    if r >= 0:
                        times[case].append(t)
            for codec_name in ("bytes", "Trajectory"):
                for i, direction in enumerate(("publish", "consume+ack")):
                    ours = [n / t[i] for t in times[(codec_name, "ours")]]
                    raw = [n / t[i] for t in times[(codec_name, "raw")]]
                    rows.append(paired_row(
                        f"transport/{tokens // 1024}k/{codec_name}/{direction}",
                        f"RedisStream vs raw redis-py {direction}, {tokens:,}-token trajectories "
                        f"({size / 1e3:.0f} KB), {'pre-encoded bytes' if codec_name == 'bytes' else 'Trajectory codec'}",
                        ours, raw, unit="records/s", target=TARGET, records=n, record_bytes=size, batch=batch))
    finally:
        client.close()
    return rows


def measure(*, rounds: int, batch: int, mb: float, sizes=(1024, 8192), aof: bool = False) -> list[dict[str, Any]]:
    """`measure_on` a throwaway redis-server on a free port."""
    from stare.services.redis_server import redis_server

    with tempfile.TemporaryDirectory(prefix="stare-bench-redis-") as d, \
            redis_server(Path(d), appendonly=aof, appendfsync="everysec") as server:
        return measure_on(server.url, rounds=rounds, batch=batch, mb=mb, sizes=sizes)


def run(quick: bool) -> list[dict[str, Any]]:
    return measure(**(QUICK if quick else FULL))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", help="an existing Redis (default: start a throwaway redis-server)")
    parser.add_argument("--rounds", type=int, default=QUICK["rounds"])
    parser.add_argument("--batch", type=int, default=64, help="records per publish and per consume")
    parser.add_argument("--mb", type=float, default=QUICK["mb"], help="payload per round and size, in MB")
    parser.add_argument("--aof", action="store_true", help="throwaway server with appendfsync everysec")
    args = parser.parse_args(argv)
    if args.url:
        rows = measure_on(args.url, rounds=args.rounds, batch=args.batch, mb=args.mb)
    else:
        rows = measure(rounds=args.rounds, batch=args.batch, mb=args.mb, aof=args.aof)
    print(f"batch {args.batch}; median of {args.rounds} rounds; ours = RedisStream, baseline = raw redis-py")
    print(format_table(rows))


if __name__ == "__main__":
    main()
