"""RedisStream vs raw redis-py on the same bytes, same Redis, same run.

Moves realistic trajectories (256 prompt tokens; 1k and 8k response tokens; packed int32 ids,
float32 log-probs, uint8 mask, ~3 characters of text per token) through one stream and its
consumer group, in batches (publish, then consume + ack):
  * raw redis-py:  pipelined XADD (MAXLEN ~), XREADGROUP, then XACK + XDEL in one MULTI (the same Redis
                   work as the product's acknowledgement, which deletes what it acknowledges so that
                   the backlog is XLEN); no record objects;
  * RedisStream:   `publish` (pipelined XADD MAXLEN ~ and an XLEN backlog check),
                   `consume` (XREADGROUP, decode, in-flight bookkeeping), `ack` (XACK + XDEL); a new
                   consumer's one read of its own pending entries is start-up, untimed like
                   raw's XGROUP CREATE;
  both twice: on already-encoded bytes (a pass-through codec: the transport's own cost), and with
  the Trajectory codec (`to_fields` on publish, `from_fields` + validation on consume), which a
  real producer/consumer pays whatever the transport.
Within a round the two arms move the same records batch by batch, taking turns (rotating which
goes first), each call timed; the round runs with the garbage collector off (as timeit does), after
one uncounted warm-up round. The ratio is the median, over every pair of back-to-back calls, of
RedisStream's records/s over raw redis-py's doing the same codec work (target >= 0.95): load that
comes and goes hits both calls of a pair alike, and a burst that lands on one call cannot move a
median over hundreds of pairs (an A/A run, raw against raw, gives 1.00 +- 0.015 at the quick size;
a ratio over whole rounds scattered 0.6-1.3 per round on a 2-core machine). `ours` and `baseline`
are each arm's median records/s per call, `spread` the lowest and highest round's median pair
ratio. Redis (a throwaway redis-server on a free port) runs without AOF by default, to time the
transport rather than the disk (`--aof`: appendfsync everysec).

Usage: python stare/app/bench/bench_transport.py [--url redis://...] [--rounds 15] [--batch 64] [--mb 40] [--aof]
(or `stare bench transport`)
"""

from __future__ import annotations

import argparse
import gc
import tempfile
import time
from pathlib import Path
from typing import Any

from stare.app.bench.common import format_table, rotated

TARGET = 0.95
QUICK = dict(rounds=15, batch=64, mb=40.0)
FULL = dict(rounds=31, batch=64, mb=96.0)


class Encoded:
    """A pass-through codec: the record is its fields (bytes in, bytes out)."""

    def __init__(self, fields: dict):
        self.fields = fields

    def to_fields(self) -> dict:
        return self.fields

    @classmethod
    def from_fields(cls, data: dict) -> Encoded:
        return cls(data)


def make_trajectories(n: int, response_tokens: int, prompt_tokens: int = 256):
    import numpy as np

    from stare.transport.records import Trajectory

    rng = np.random.default_rng(0)
    out = []
    for i in range(n):
        out.append(
            Trajectory(
                run_id="bench",
                trajectory_id=f"{i:08x}",
                group_id=f"g{i // 8}",
                group_size=8,
                weight_version=3,
                prompt_token_ids=rng.integers(0, 150_000, prompt_tokens, dtype=np.int32),
                response_token_ids=rng.integers(0, 150_000, response_tokens, dtype=np.int32),
                response_logprobs=-rng.exponential(1.0, response_tokens).astype(np.float32),
                loss_mask=np.ones(response_tokens, dtype=np.uint8),
                finish_reason="length",
                answer="42",
                problem_id=f"p{i // 8}",
                data_source="bench",
                response_text="x" * (response_tokens * 3),
                reward=1.0,
                reward_info={"correct": True},
            )
        )
    return out


class OursArm:
    """RedisStream: `publish`, then `consume` + `ack`. A new consumer's one read of its own pending
    entries is start-up, untimed like raw's XGROUP CREATE."""

    def __init__(self, client, run_id: str, codec, n: int, batch: int):
        from stare.transport.redis_streams import RedisStream

        self.stream = RedisStream(client, run_id, "scored", codec, group="learner", maxlen=2 * n, max_backlog=n)
        self.stream.consume("l", batch)
        self.client, self.key = client, self.stream.key

    def publish(self, records) -> None:
        self.stream.publish(records)

    def consume_ack(self, count: int) -> int:
        deliveries = self.stream.consume("l", count)
        self.stream.ack([d.id for d in deliveries])
        return len(deliveries)


class RawArm:
    """Raw redis-py: pipelined XADD (MAXLEN ~), XREADGROUP + the codec's decode + XACK and XDEL in one MULTI."""

    def __init__(self, client, run_id: str, codec, n: int, batch: int):
        self.client, self.codec, self.maxlen = client, codec, 2 * n
        self.key = f"stare:{run_id}:stream:scored"
        client.xgroup_create(self.key, "learner", id="0", mkstream=True)

    def publish(self, records) -> None:
        pipe = self.client.pipeline(transaction=False)
        for r in records:
            pipe.xadd(self.key, r.to_fields(), maxlen=self.maxlen, approximate=True)
        pipe.execute()

    def consume_ack(self, count: int) -> int:
        reply = self.client.xreadgroup("learner", "l", {self.key: ">"}, count=count)
        entries = reply[0][1] if reply else []
        decoded = [self.codec.from_fields(f) for _, f in entries]  # noqa: F841 (what a consumer needs)
        if entries:
            ids = [i for i, _ in entries]
            pipe = self.client.pipeline(transaction=True)
            pipe.xack(self.key, "learner", *ids)
            pipe.xdel(self.key, *ids)
            pipe.execute()
        return len(entries)


def one_round(arms: dict[str, Any], records, batch: int, first: int = 0) -> dict[str, tuple[list, list]]:
    """Both arms move the same records, interleaved batch by batch (rotating which goes first), each
    call timed: {arm: ([(records, seconds) per publish], [(records, seconds) per consume + ack])}.
    The k-th calls of the two arms ran back to back."""
    n, names = len(records), list(arms)
    calls: dict[str, tuple[list, list]] = {name: ([], []) for name in names}
    for k, a in enumerate(range(0, n, batch)):
        chunk = records[a : a + batch]
        for name in rotated(names, first + k):
            t0 = time.perf_counter()
            arms[name].publish(chunk)
            calls[name][0].append((len(chunk), time.perf_counter() - t0))
    got, k = dict.fromkeys(names, 0), 0
    while any(g < n for g in got.values()):
        for name in rotated(names, first + k):
            if got[name] < n:
                t0 = time.perf_counter()
                moved = arms[name].consume_ack(batch)
                calls[name][1].append((moved, time.perf_counter() - t0))
                if moved == 0:
                    raise RuntimeError(f"transport bench: {name} read nothing with {n - got[name]} records unread")
                got[name] += moved
        k += 1
    for arm in arms.values():
        arm.client.delete(arm.key)
    return calls


def batch_pairs_row(name: str, what: str, rounds: list[tuple[list, list]], **extra: Any) -> dict[str, Any]:
    """A row from rounds of paired calls [(ours calls, raw calls)], each call (records, seconds):
    `ratio` = the median over every pair of calls of ours' records/s over raw's (interference
    that lands on one call cannot move it), `ours`/`baseline` = each arm's median records/s per
    call, `spread` = the lowest and highest round's median pair ratio."""
    from stare.app.bench.common import median, row

    def rate(call: tuple[int, float]) -> float:
        return call[0] / call[1]

    per_round = [[rate(o) / rate(r) for o, r in zip(ours, raw)] for ours, raw in rounds]
    round_medians = [median(p) for p in per_round]
    return row(
        name,
        what,
        ours=median([rate(c) for ours, _ in rounds for c in ours]),
        baseline=median([rate(c) for _, raw in rounds for c in raw]),
        unit="records/s",
        target=TARGET,
        ratio=median([x for p in per_round for x in p]),
        spread=[min(round_medians), max(round_medians)],
        repeats=len(rounds),
        pairs=sum(len(p) for p in per_round),
        samples={"round_median_ratios": round_medians},
        ratio_of="call pairs",
        **extra,
    )


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

    from stare.transport.records import Trajectory

    client = redis.Redis.from_url(url, socket_timeout=30, socket_connect_timeout=5)
    rows = []
    try:
        for tokens in sizes:
            records = make_trajectories(max(batch, 8), tokens)
            size = sum(len(v) for v in records[0].to_fields().values())
            n = max(batch, int(mb * 1e6 / size) // batch * batch)
            records = make_trajectories(n, tokens)
            encoded = [Encoded(r.to_fields()) for r in records]
            for codec_name, recs, codec in (("bytes", encoded, Encoded), ("Trajectory", records, Trajectory)):
                kept = []
                for r in range(-1, rounds):  # round -1 warms Redis' allocator up and is not counted
                    arms = {
                        "ours": OursArm(client, f"bench-ours-{codec_name}-{r}", codec, n, batch),
                        "raw": RawArm(client, f"bench-raw-{codec_name}-{r}", codec, n, batch),
                    }
                    got = without_gc(one_round, arms, recs, batch, r)
                    if r >= 0:
                        kept.append(got)
                for i, direction in enumerate(("publish", "consume+ack")):
                    rows.append(
                        batch_pairs_row(
                            f"transport/{tokens // 1024}k/{codec_name}/{direction}",
                            f"RedisStream vs raw redis-py {direction}, {tokens:,}-token trajectories "
                            f"({size / 1e3:.0f} KB), {'pre-encoded bytes' if codec_name == 'bytes' else 'Trajectory codec'}",
                            [(got["ours"][i], got["raw"][i]) for got in kept],
                            records=n,
                            record_bytes=size,
                            batch=batch,
                        )
                    )
    finally:
        client.close()
    return rows


def measure(*, rounds: int, batch: int, mb: float, sizes=(1024, 8192), aof: bool = False) -> list[dict[str, Any]]:
    """`measure_on` a throwaway redis-server on a free port."""
    from services.redis_server import redis_server

    with (
        tempfile.TemporaryDirectory(prefix="stare-bench-redis-") as d,
        redis_server(Path(d), appendonly=aof, appendfsync="everysec") as server,
    ):
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
    print(
        f"batch {args.batch}; {args.rounds} rounds; ratio = median over every pair of back-to-back calls; "
        "ours = RedisStream, baseline = raw redis-py"
    )
    print(format_table(rows))


if __name__ == "__main__":
    main()
