"""The chaos run: `stare up` trained for N steps while its parts are killed, then checked exactly.

    .venv/bin/python scripts/chaos.py --steps 30                  # minutes on a laptop CPU
    .venv/bin/python scripts/chaos.py --steps 300 --out runs      # what docs/distributed.md reports

It writes a small config (the bundled tiny model; dynamic sampling off and stale groups
importance-corrected, so that every published group is trained and "nothing lost" is an exact count),
starts `stare up` as a terminal would, and once the run trains:
  1. changes the entropy target over the REST API (PUT /v1/entropy) and waits until the learner applied it;
  2. BGREWRITEAOF, then SIGKILL Redis (stare up restarts it from its AOF);
  3. SIGKILL a rollout worker, 4. SIGKILL a reward worker (each with its process group, as a crash would);
  5. SIGKILL the learner (it resumes from its last checkpoint);
  6. SIGKILL Redis again;
each at its own point of the run (fractions of N), the next one only after the run trained on. When
`stare up` has finished, it starts the run's redis-server from its AOF and checks (stare.observe.lineage):
every step trained exactly once (trained.jsonl, metrics.jsonl), no trajectory trained twice, no published
group lost (trained, or still in a stream), and the entropy target of step 1 in force from the step it was
applied at to the last, across every fault. Prints what happened and the checks; exit 0 when all hold.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import secrets
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import redis
import yaml

TARGET = 0.45  # the entropy target the run is changed to (the tiny config's is 0.3)
PROMPTS, SAMPLES = 4, 4
FAULTS = (  # (fraction of the steps after which it happens, what)
    (0.15, "redis-rewrite-kill"),
    (0.30, "rollout-0"),
    (0.45, "reward-0"),
    (0.60, "learner"),
    (0.80, "redis-kill"),
)


def config(out: Path, steps: int, name: str) -> dict:
    return {
        "run": {"name": name, "output_dir": str(out), "steps": steps, "checkpoint_every": 5, "threads": 1},
        "task": {"eval_problems": 4, "eval_every": 1000, "eval_k": 2},
        "rollout": {"prompts_per_step": PROMPTS, "samples_per_prompt": SAMPLES, "max_new_tokens": 12},
        "data": {"dynamic_sampling": False},
        "optim": {"lr": 1e-4, "micro_batch": 16},
        "loss": {"name": "stare", "rollout_correction": {"is_level": "token", "is_cap": 2.0}},
        "system": {
            "max_staleness": 1,
            "stale_policy": "importance",
            "claim_idle_s": 3.0,
            "heartbeat_s": 0.5,
            "rollout_batch_prompts": 2,
            "broadcast_timeout_s": 10.0,
        },
        "control_plane": {"port": 0},
    }


class Up:
    """`stare up` in its own session (the terminal's process group), its output kept and echoed."""

    def __init__(self, config_path: Path, token: str, log_path: Path, quiet: bool):
        env = {**os.environ, "STARE_API_TOKEN": token}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "stare.app.cli", "up", "--config", str(config_path)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
            start_new_session=True,
        )
        self.lines: list[str] = []
        self.log = log_path.open("w")
        self.quiet = quiet
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        for line in iter(self.proc.stdout.readline, ""):
            self.lines.append(line.rstrip("\n"))
            self.log.write(line)
            self.log.flush()
            if not self.quiet:
                sys.stdout.write(line)

    def pid(self, role: str) -> int:
        """The newest pid of `role` (a restarted role says "started" again)."""
        pids = [int(m.group(1)) for line in self.lines if (m := re.search(rf"started {role} \(pid (\d+)\)", line))]
        if not pids:
            raise RuntimeError(f"stare up never said it started {role}")
        return pids[-1]

    def api(self) -> str:
        for line in self.lines:
            if m := re.search(r"API (http://\S+?)/v1/status", line):
                return m.group(1)
        raise RuntimeError("stare up did not say where its API is")

    def count(self, pattern: str) -> int:
        return sum(bool(re.search(pattern, line)) for line in self.lines)


def steps_done(run_dir: Path) -> int:
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return 0
    lines = [line for line in path.read_text().splitlines() if line.strip()]
    return json.loads(lines[-1])["step"] if lines else 0


def wait_for(what: str, ok, up: Up, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not ok():
        if up.proc.poll() is not None:
            raise RuntimeError(f"stare up exited with {up.proc.returncode} while waiting for {what}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what}: not within {timeout_s:.0f}s")
        time.sleep(0.2)


def http(method: str, url: str, token: str, body: dict | None = None):
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, method=method, headers={"Authorization": f"Bearer {token}"})
    if data is not None:
        request.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(request, timeout=10) as r:
        return json.loads(r.read())


def change_target(up: Up, token: str, timeout_s: float) -> int:
    """PUT the new entropy target; the step the learner applied it at."""
    api = up.api()
    wait_for("the controller's state", lambda: _answers(f"{api}/v1/entropy", token), up, timeout_s)
    change = http("PUT", f"{api}/v1/entropy", token, {"target": TARGET})["audit"]
    applied: list[int] = []

    def done() -> bool:
        entry = next(e for e in http("GET", f"{api}/v1/entropy/audit", token) if e["id"] == change["id"])
        if entry["applied_step"] is not None:
            applied.append(entry["applied_step"])
        return bool(applied)

    wait_for("the entropy change to be applied", done, up, timeout_s)
    return applied[0]


def _answers(url: str, token: str) -> bool:
    try:
        http("GET", url, token)
        return True
    except Exception:
        return False


def redis_client(run_dir: Path) -> redis.Redis:
    url = (run_dir / "up" / "redis.url").read_text().strip()
    return redis.Redis.from_url(url, socket_timeout=10, socket_connect_timeout=10)


def kill_redis(run_dir: Path, rewrite: bool) -> str:
    client = redis_client(run_dir)
    if rewrite:
        client.bgrewriteaof()
        deadline = time.monotonic() + 60
        while (info := client.info("persistence"))["aof_rewrite_in_progress"] or info["aof_rewrite_scheduled"]:
            if time.monotonic() > deadline:
                raise RuntimeError("BGREWRITEAOF did not finish in 60 s")
            time.sleep(0.05)
    pid = int(client.info("server")["process_id"])
    client.close()
    os.kill(pid, signal.SIGKILL)
    return f"redis-server (pid {pid}){' after BGREWRITEAOF' if rewrite else ''}"


def fault(kind: str, up: Up, run_dir: Path) -> str:
    if kind.startswith("redis"):
        return kill_redis(run_dir, rewrite=kind == "redis-rewrite-kill")
    pid = up.pid(kind)
    os.killpg(pid, signal.SIGKILL)
    return f"{kind} (pid {pid})"


def verify(run_dir: Path, steps: int, applied_at: int) -> list[str]:
    """The checks; empty when every one holds."""
    from services.redis_server import RedisServer
    from stare.observe.lineage import read_lineage
    from stare.runtime.net import free_port

    conf = (run_dir / "up" / "redis" / "redis.conf").read_text().split()
    server = RedisServer(
        run_dir / "up" / "redis", free_port(), password=conf[1] if conf[:1] == ["requirepass"] else None
    )
    server.start(timeout_s=60)
    try:
        client = redis.Redis.from_url(server.url, socket_timeout=10)
        lineage = read_lineage(run_dir, client)
        client.close()
    finally:
        server.kill()
    print(f"lineage: {lineage.summary()}")
    problems = lineage.problems(steps, PROMPTS * SAMPLES)
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    off = [m["step"] for m in metrics if m["step"] >= applied_at and m["target"] != TARGET]
    if off:
        problems.append(
            f"the entropy target {TARGET} (applied at step {applied_at}) is not in force at steps {off[:10]}"
        )
    return problems


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=30, help="steps to train (default 30; the docs run 300)")
    p.add_argument("--out", type=Path, default=Path("runs"), help="run.output_dir (default runs/)")
    p.add_argument("--name", default="chaos", help="run.name (default chaos); the folder must not hold a run")
    p.add_argument("--timeout-s", type=float, default=600.0, help="how long any one phase may take (default 600)")
    p.add_argument(
        "--quiet", action="store_true", help="do not echo stare up's output (it is in <out>/<name>.chaos.log)"
    )
    args = p.parse_args(argv)
    if args.steps < 10:
        p.error("--steps must be >= 10: the faults need room between them")
    run_dir = args.out / args.name
    if run_dir.exists():
        p.error(f"{run_dir} exists: choose another --name or --out (a chaos run starts from nothing)")
    args.out.mkdir(parents=True, exist_ok=True)
    config_path, log_path = args.out / f"{args.name}.chaos.yaml", args.out / f"{args.name}.chaos.log"
    config_path.write_text(yaml.safe_dump(config(args.out, args.steps, args.name), sort_keys=False))
    token = secrets.token_hex(16)
    up = Up(config_path, token, log_path, args.quiet)
    done: list[str] = []
    t0 = time.monotonic()
    try:
        wait_for("step 1", lambda: steps_done(run_dir) >= 1, up, args.timeout_s)
        applied_at = change_target(up, token, args.timeout_s)
        done.append(f"entropy target -> {TARGET} over the API, applied at step {applied_at}")
        for fraction, kind in FAULTS:
            at = max(int(args.steps * fraction), steps_done(run_dir) + 1)
            wait_for(f"step {at}", lambda at=at: steps_done(run_dir) >= at, up, args.timeout_s)
            done.append(f"step {steps_done(run_dir)}: SIGKILL {fault(kind, up, run_dir)}")
            print(f"chaos | {done[-1]}", flush=True)
        code = up.proc.wait(timeout=args.timeout_s * 4)
    except BaseException:
        os.killpg(up.proc.pid, signal.SIGINT)
        up.proc.wait(timeout=120)
        raise
    print(f"\nchaos | stare up exited with {code} after {time.monotonic() - t0:.0f}s")
    for line in done:
        print(f"chaos | {line}")
    restarts = {r: up.count(rf"{r} exited with .*; restarting") for r in ("learner", "rollout-0", "reward-0")}
    restarts["redis-server"] = up.count(r"redis-server exited with .*; restarting")
    print(f"chaos | restarts: {restarts}")
    problems = [] if code == 0 else [f"stare up exited with {code} (see {log_path})"]
    problems += verify(run_dir, args.steps, applied_at)
    for line in problems:
        print(f"chaos | FAILED: {line}")
    if not problems:
        print(f"chaos | every step once, 0 trajectories lost, 0 trained twice, target {TARGET} in force to the end")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
