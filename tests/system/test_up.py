"""`stare up` end to end: every role a real OS process, a real redis-server, real weight broadcast.

Each test trains the tiny config for 30 short steps and checks the run's data lineage
(runs/<name>/trained.jsonl: the trajectory ids each step trained):
* never trained twice: every trajectory id appears once;
* never lost: once the run has stopped, every group the learner published was trained or still has
  an unacknowledged entry in one of the run's streams (read from the redis-server's AOF). Stale
  groups are trained with importance correction here, not dropped, and no group is filtered, so
  "finished" means "trained".
"""

from __future__ import annotations

import io
import json
import os
import re
import signal
import threading
import time
from pathlib import Path

import pytest
import redis
from redis_fixtures import have_redis_server

from stare.app.launch.processes import ProcessLauncher as Launcher
from stare.config import build_config
from stare.runstate.redis_state import RedisRunState

pytestmark = [
    pytest.mark.slow,
    pytest.mark.redis,
    pytest.mark.skipif(not have_redis_server(), reason="redis-server is not installed"),
]

PROMPTS, SAMPLES, STALENESS = 4, 4, 1
WINDOW = PROMPTS * (1 + STALENESS)


def _config(model_dir: Path, out: Path, steps: int, **extra):
    raw = {
        "run": {"name": "up", "output_dir": str(out), "steps": steps, "checkpoint_every": 5, "threads": 1},
        "model": {"path": str(model_dir)},
        "task": {"eval_problems": 4, "eval_every": 1000, "eval_k": 2},
        "rollout": {"prompts_per_step": PROMPTS, "samples_per_prompt": SAMPLES, "max_new_tokens": 12},
        "data": {"dynamic_sampling": False},
        "optim": {"lr": 1e-4, "micro_batch": 16},
        "loss": {"name": "stare", "tis_cap": 2.0},
        "system": {
            "max_staleness": STALENESS,
            "stale_policy": "importance",
            "claim_idle_s": 3.0,
            "heartbeat_s": 0.5,
            "rollout_batch_prompts": 2,
            "broadcast_timeout_s": 10.0,
        },
        "control_plane": {"port": 0, "allow_unauthenticated": True},
    }
    for key, value in extra.items():
        section, name = key.split("__")
        raw.setdefault(section, {})[name] = value
    return build_config(raw)


class Run:
    """A Launcher supervised in a background thread, with helpers to watch its run folder."""

    def __init__(self, cfg, *, rollout: int, reward: int, control: bool = True):
        self.log = io.StringIO()
        self.launcher = Launcher(
            cfg, rollout=rollout, reward=reward, out=self.log, color=False, grace_s=30, control=control
        )
        self.dir = cfg.run_dir
        self.code: int | None = None

    def __enter__(self):
        self.launcher.start()
        self.thread = threading.Thread(target=self._supervise, daemon=True)
        self.thread.start()
        return self

    def _supervise(self):
        self.code = self.launcher.supervise(poll_s=0.2)

    def __exit__(self, *exc):
        self.launcher.stop()
        self.thread.join(timeout=30)
        (self.dir.parent / "launcher.log").write_text(self.log.getvalue())  # for the failure message

    def steps_done(self) -> int:
        path = self.dir / "metrics.jsonl"
        if not path.exists():
            return 0
        lines = [json.loads(line) for line in _whole_lines(path)]
        return lines[-1]["step"] if lines else 0

    def wait_for_step(self, step: int, timeout_s: float = 240) -> None:
        deadline = time.monotonic() + timeout_s
        while self.steps_done() < step:
            assert self.code in (None, 0), self.tail()
            assert time.monotonic() < deadline, f"step {step} not reached in {timeout_s}s\n{self.tail()}"
            time.sleep(0.05)

    def wait_finished(self, timeout_s: float = 300) -> None:
        self.thread.join(timeout=timeout_s)
        assert not self.thread.is_alive(), f"the run did not finish in {timeout_s}s\n{self.tail()}"
        assert self.code == 0, self.tail()

    def tail(self, n: int = 60) -> str:
        return "\n".join(self.log.getvalue().splitlines()[-n:])


def _whole_lines(path: Path) -> list[str]:
    """The file's complete lines: a last line the learner is still appending (no newline yet) is left out."""
    text = path.read_text()
    return [line for line in text[: text.rfind("\n") + 1].splitlines() if line.strip()]


def _trained(run_dir: Path) -> list[list[str]]:
    return [json.loads(line)["ids"] for line in _whole_lines(run_dir / "trained.jsonl")]


def _pause(state, run: Run, timeout_s: float = 60) -> None:
    """Pause the learner and wait until it is (before its next step): whatever the machine's speed, nothing
    trains, checkpoints or finishes until `state.set_paused(False)`."""
    state.set_paused(True)
    deadline = time.monotonic() + timeout_s
    while (state.status() or {}).get("phase") != "paused":
        assert time.monotonic() < deadline, run.tail()
        time.sleep(0.02)


def _groups_still_in_redis(server, run_id: str) -> set[int]:
    """Groups with an entry some consumer group has not acknowledged yet (pending, or never
    delivered) in any of the run's streams: what a stopped run still has in flight."""
    client = redis.Redis.from_url(server.url, socket_timeout=10)
    out: set[int] = set()
    for name, group in (("prompts", "rollout"), ("raw", "reward"), ("scored", "learner")):
        key = f"stare:{run_id}:stream:{name}"
        if not client.exists(key):
            continue
        info = next(g for g in client.xinfo_groups(key) if g["name"].decode() == group)
        pending = [p["message_id"] for p in client.xpending_range(key, group, min="-", max="+", count=100_000)]
        entries = [e for i in pending for e in client.xrange(key, i, i)]
        entries += client.xrange(key, min=b"(" + info["last-delivered-id"], max="+")
        for _, fields in entries:
            out.add(int(json.loads(fields[b"json"])["group_id"].removeprefix("g")))
    client.close()
    return out


def _assert_nothing_lost_or_trained_twice(
    run_dir: Path, steps: int, server, late_allowed: int = WINDOW * SAMPLES
) -> None:
    """Exact accounting once the run has stopped: every group the learner published (its cursor in
    Redis) was trained exactly once or is still in flight in a stream; no trajectory twice."""
    per_step = _trained(run_dir)
    ids = [i for step in per_step for i in step]
    assert len(per_step) == steps and len(ids) == steps * PROMPTS * SAMPLES
    assert len(ids) == len(set(ids)), "a trajectory was trained twice"
    trained = {int(re.match(r"g(\d+):", i).group(1)) for i in ids}
    server.start()  # the run's redis-server again, from its AOF
    try:
        client = redis.Redis.from_url(server.url, socket_timeout=10)
        published = int(client.hget(f"stare:{run_dir.name}:feeder", "cursor"))
        client.close()
        in_flight = _groups_still_in_redis(server, run_dir.name)
    finally:
        server.kill()
    lost = sorted(set(range(published)) - trained - in_flight)
    log = (run_dir.parent / "launcher.log").read_text() if (run_dir.parent / "launcher.log").exists() else ""
    assert lost == [], f"groups neither trained nor in a stream: {lost}\n{log[-20000:]}"
    assert trained | in_flight <= set(range(published))
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    print(
        f"lineage: published {published} groups, trained {len(trained)} ({len(ids)} trajectories, all distinct), "
        f"in flight at the end {len(in_flight)}, lost 0; duplicates dropped {metrics[-1]['duplicates_total']}"
    )
    assert [m["step"] for m in metrics] == list(range(1, steps + 1))
    # only what was in flight when a worker died comes back later than the window (reclaimed)
    late = sum(n for m in metrics for lag, n in m["staleness_hist"].items() if int(lag) > STALENESS)
    assert late <= late_allowed


def _assert_prometheus_counts_every_step(server, run_id: str, steps: int) -> None:
    """The control plane's /metrics over the finished run's Redis state (from its AOF), parsed with
    prometheus-client's parser: the step gauges, one histogram observation per step, dead letters
    of each stream."""
    from fastapi.testclient import TestClient
    from prometheus_client.parser import text_string_to_metric_families

    from services.control.app import create_app
    from stare.config import ControlPlaneSection

    server.start()
    try:
        state = RedisRunState.connect(server.url, run_id)
        text = (
            TestClient(create_app(state, ControlPlaneSection(trusted_hosts=["testserver"]), run_id, token="t"))
            .get("/metrics")
            .text
        )
        state.close()
    finally:
        server.kill()
    samples = {
        (s.name, tuple(sorted((k, v) for k, v in s.labels.items() if k != "run_id"))): s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
    }
    assert samples[("stare_step", ())] == samples[("stare_weight_version", ())] == steps
    assert samples[("stare_step_duration_seconds_count", ())] == steps
    assert samples[("stare_weight_sync_duration_seconds_count", ())] == steps
    assert {labels for name, labels in samples if name == "stare_dead_letters"} == {
        (("stream", s),) for s in ("prompts", "raw", "scored")
    }


def test_up_trains_across_processes_and_survives_sigkilled_workers(tiny_model_dir, tmp_path):
    steps = 30
    with Run(_config(tiny_model_dir, tmp_path, steps), rollout=2, reward=2) as run:
        roles = run.launcher.roles
        assert len(roles) == 6 and all(r.alive() for r in roles.values())  # control, learner, 2 rollout, 2 reward
        run.wait_for_step(3)
        run.launcher.kill("rollout-0")
        run.launcher.kill("reward-0")
        run.wait_finished()
        assert roles["rollout-0"].exits[0] == -signal.SIGKILL and roles["reward-0"].exits[0] == -signal.SIGKILL
        assert roles["learner"].restarts == 0
    _assert_nothing_lost_or_trained_twice(tmp_path / "up", steps, run.launcher.redis)
    assert (tmp_path / "up" / "eval.jsonl").exists()
    _assert_prometheus_counts_every_step(run.launcher.redis, "up", steps)


def test_a_sigkilled_learner_resumes_from_its_checkpoint_and_retrains_what_waited_in_redis(tiny_model_dir, tmp_path):
    steps = 30
    cfg = _config(tiny_model_dir, tmp_path, steps)
    with Run(cfg, rollout=1, reward=1) as run:
        run.wait_for_step(6)  # a checkpoint at step 5, then at least one step it does not hold
        # ask for the change just past a checkpoint (steps 5k + 1), so that it is applied, and the learner
        # killed, before the next one holds it (on a fast machine the steps outrun a fixed step number)
        deadline = time.monotonic() + 60
        while len(_trained(run.dir)) % 5 != 1:
            assert time.monotonic() < deadline and len(_trained(run.dir)) < 22, "no step 5k + 1 seen"
            time.sleep(0.01)
        state = RedisRunState.connect(run.launcher.redis_url, cfg.run.name)
        _pause(state, run)  # held past that checkpoint and before the next, however fast the steps are
        change = state.request_entropy_change({"target": 0.45}, "test")  # applied while paused
        deadline = time.monotonic() + 60
        while (applied_at := state.audit()[-1].applied_step) is None:
            assert time.monotonic() < deadline, "the learner did not apply the entropy change"
            time.sleep(0.05)
        run.launcher.kill("learner")
        state.set_paused(False)  # the restarted learner trains on
        saved = int((run.dir / "checkpoints" / "latest").read_text().strip().removeprefix("step_"))
        lost_steps = _trained(run.dir)[saved:]  # trained after the checkpoint: pending in Redis
        assert lost_steps, "the learner died before training past its checkpoint"
        assert applied_at > saved, "the checkpoint holds the entropy change: nothing to apply again"
        run.wait_finished()
        assert run.launcher.roles["learner"].restarts == 1
        assert [(e.id, e.applied_step) for e in state.audit()] == [(change.id, applied_at)]
        state.close()
    # the restarted learner applied the change again at the step it first applied at, not never
    metrics = [json.loads(line) for line in (tmp_path / "up" / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics if m["target"] == 0.45] == list(range(applied_at, steps + 1))
    retrained = {i for step in _trained(tmp_path / "up") for i in step}
    assert {i for ids in lost_steps for i in ids} <= retrained
    # The restarted learner publishes its checkpoint's weights under a version newer than any the dead
    # one published (the workers hold those and take only newer ones), so versions run ahead of steps
    # from then on, and what was sampled before the crash, the retrained steps included, counts as
    # older by that gap.
    assert metrics[-1]["weight_version"] > metrics[-1]["step"] == steps
    late_allowed = WINDOW * SAMPLES + sum(len(ids) for ids in lost_steps)
    _assert_nothing_lost_or_trained_twice(tmp_path / "up", steps, run.launcher.redis, late_allowed)


def test_one_writer_per_run_folder_and_the_launchers_own_restarted_learner_is_not_refused(
    tiny_model_dir, tmp_path, capsys
):
    """While `stare up` runs, `stare train --resume` of its folder and a second `stare up` are refused (the
    second before it writes a file or starts a Redis); its learner, SIGKILLed and restarted by the
    launcher, writes under the launcher's lock and finishes the run, resuming from its newest checkpoint
    even with `checkpoints/latest` gone (a folder with checkpoints is a run, never started over)."""
    import os

    from stare.app.cli import main
    from stare.runtime.run_lock import RunLockError

    steps = 12
    cfg = _config(tiny_model_dir, tmp_path, steps)
    with Run(cfg, rollout=1, reward=1, control=False) as run:
        run.wait_for_step(6)  # a checkpoint at step 5: the folder can be resumed
        state = RedisRunState.connect(run.launcher.redis_url, cfg.run.name)
        _pause(state, run)  # the run cannot finish before its learner is killed, however fast the steps are
        url = (run.dir / "up" / "redis.url").read_bytes()
        code = main(["train", "--no-progress", "--resume", str(run.dir), "--set", f"run.steps={steps + 5}"])
        err = capsys.readouterr().err
        assert code == 2 and f"stare: run folder {run.dir} is in use by pid {os.getpid()} on host " in err, err
        with pytest.raises(RunLockError, match=f"is in use by pid {os.getpid()}"):
            Launcher(cfg, rollout=1, reward=1, out=io.StringIO(), color=False, control=False)
        assert (run.dir / "up" / "redis.url").read_bytes() == url
        (run.dir / "checkpoints" / "latest").unlink()
        run.launcher.kill("learner")
        state.set_paused(False)
        state.close()
        run.wait_finished()
        assert run.launcher.roles["learner"].restarts == 1
        assert "in use" not in run.log.getvalue()
        assert re.search(rf"resumed {re.escape(str(run.dir))} at step (5|10)\b", run.log.getvalue()), run.tail()
    assert (run.dir / ".lock").read_text() == ""  # released once every role stopped
    metrics = [json.loads(line)["step"] for line in (run.dir / "metrics.jsonl").read_text().splitlines()]
    assert metrics == list(range(1, steps + 1))


def test_every_role_reconnects_after_redis_restarts(tiny_model_dir, tmp_path):
    steps = 30
    with Run(_config(tiny_model_dir, tmp_path, steps), rollout=1, reward=1) as run:
        run.wait_for_step(3)
        os.kill(run.launcher.redis.proc.pid, signal.SIGKILL)  # only what the AOF (fsync always) holds survives
        run.wait_finished()  # the launcher started it again on its port
        assert run.launcher.redis_restarts == 1
        restarts = {name: r.restarts for name, r in run.launcher.roles.items()}
        assert restarts == dict.fromkeys(restarts, 0), f"roles died instead of reconnecting: {restarts}"
    _assert_nothing_lost_or_trained_twice(tmp_path / "up", steps, run.launcher.redis)


def test_strictly_on_policy_with_the_filesystem_backend_samples_with_the_learners_exact_weights(
    tiny_model_dir, tmp_path
):
    steps = 6
    cfg = _config(tiny_model_dir, tmp_path, steps, system__max_staleness=0, system__weight_sync="filesystem")
    with Run(cfg, rollout=1, reward=1) as run:
        run.wait_finished()
        status = RedisRunState.connect(run.launcher.redis_url, cfg.run.name).status()
    rows = cfg.rollout.prompts_per_step * cfg.rollout.samples_per_prompt
    assert status["staleness"] == {"max": 0, "counts": {"0": rows}}  # the shape /v1/status and /metrics read
    metrics = [json.loads(line) for line in (tmp_path / "up" / "metrics.jsonl").read_text().splitlines()]
    assert [m["staleness_max"] for m in metrics] == [0] * steps
    # the rollout engine's log-probs equal the learner's recompute: it sampled with the new weights
    assert max(m["rollout_logprob_gap"] for m in metrics) < 1e-4
    assert sorted(p.name for p in (tmp_path / "up" / "weights").iterdir())[-1] == f"v{steps:08d}"


def test_strictly_on_policy_with_the_broadcast_backend_samples_with_the_learners_exact_weights(
    tiny_model_dir, tmp_path
):
    steps = 6
    with Run(_config(tiny_model_dir, tmp_path, steps, system__max_staleness=0), rollout=2, reward=1) as run:
        run.wait_finished()
    metrics = [json.loads(line) for line in (tmp_path / "up" / "metrics.jsonl").read_text().splitlines()]
    assert [m["staleness_max"] for m in metrics] == [0] * steps
    assert max(m["rollout_logprob_gap"] for m in metrics) < 1e-4


def test_a_paused_learner_trains_nothing_and_says_training_again_once_resumed(tiny_model_dir, tmp_path):
    steps = 4
    cfg = _config(tiny_model_dir, tmp_path, steps, system__max_staleness=0)
    with Run(cfg, rollout=1, reward=1, control=False) as run:
        state = RedisRunState.connect(run.launcher.redis_url, cfg.run.name)
        # asked before the first step (the roles' start and the step-0 evaluation first: wait_for_step's limit)
        _pause(state, run, timeout_s=240)
        held = run.steps_done()
        time.sleep(3.0)
        assert run.steps_done() == held and state.status()["phase"] == "paused"
        state.set_paused(False)
        deadline = time.monotonic() + 60
        while (phase := state.status()["phase"]) == "paused":  # then training, or already finished
            assert time.monotonic() < deadline, run.tail()
            time.sleep(0.02)
        assert phase in ("training", "finished") and "resumed" in run.log.getvalue(), run.tail()
        run.wait_finished()
        assert state.status()["phase"] == "finished" and run.steps_done() == steps > held


def _start_up_in_a_terminal_group(tiny_model_dir, tmp_path):
    """`stare up` as a terminal would run it: its own process group, which a Ctrl-C signals whole."""
    import subprocess
    import sys

    import yaml

    from learner.engine.deepspeed_engine import child_env

    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(_config(tiny_model_dir, tmp_path, 200).model_dump(mode="json")))
    proc = subprocess.Popen(
        [sys.executable, "-m", "stare.app.cli", "up", "--config", str(config), "--no-control"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=child_env(),
        start_new_session=True,
    )
    metrics = tmp_path / "up" / "metrics.jsonl"
    deadline = time.monotonic() + 240
    while not (metrics.exists() and len(metrics.read_text().splitlines()) >= 2):
        assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read() if proc.poll() else "timeout"
        time.sleep(0.2)
    return proc, metrics


def _alive(pid: int) -> bool:
    import os

    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False


def test_ctrl_c_stops_every_role_and_leaves_a_resumable_checkpoint(tiny_model_dir, tmp_path):
    import os

    proc, metrics = _start_up_in_a_terminal_group(tiny_model_dir, tmp_path)
    os.killpg(proc.pid, signal.SIGINT)  # the whole foreground group, redis-server's session excluded
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, out
    pids = [int(p) for p in re.findall(r"started \S+ \(pid (\d+)\)", out)]
    assert len(pids) == 3  # learner, rollout-0, reward-0
    assert not any(_alive(p) for p in pids), out
    assert "Traceback" not in out, out  # Redis outlived the roles: every role stopped cleanly
    steps = len(metrics.read_text().splitlines())
    assert (tmp_path / "up" / "checkpoints" / "latest").read_text().strip() == f"step_{steps:06d}", out


def test_a_second_ctrl_c_kills_what_is_left_at_once(tiny_model_dir, tmp_path):
    import os

    proc, _ = _start_up_in_a_terminal_group(tiny_model_dir, tmp_path)
    os.killpg(proc.pid, signal.SIGINT)
    os.killpg(proc.pid, signal.SIGINT)  # impatient: no deadlock, no 60 s grace
    t0 = time.monotonic()
    out, _ = proc.communicate(timeout=60)
    assert time.monotonic() - t0 < 30, out
    pids = [int(p) for p in re.findall(r"started \S+ \(pid (\d+)\)", out)]
    assert pids and not any(_alive(p) for p in pids), out
