"""One writer per run folder (stare.runtime.run_lock): a live holder refuses every other writer with one
line naming it; a child handed the locked descriptor (a learner under `stare up`) and a delegate with the
holder's token (the Ray target's learner actor) write under it; a dead holder's lock is taken over with
a warning; a record from another kernel counts while its holder renews it. Real processes, real flock."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time

import pytest

from stare.runtime.run_lock import FD_ENV, STALE_S, TOKEN_ENV, RunLock, RunLockError

# a child that takes the lock of the folder in argv[1] and prints how it holds it ("held", "inherited", ...)
CHILD = textwrap.dedent("""
    import sys
    from pathlib import Path
    from stare.runtime.run_lock import RunLock, RunLockError
    try:
        lock = RunLock(Path(sys.argv[1]), command="child", say=lambda m: print(m, flush=True)).acquire()
    except RunLockError as err:
        print("refused:", err, flush=True)
        sys.exit(2)
    print(lock.mode, flush=True)
    if len(sys.argv) > 2:
        import os
        os.kill(os.getpid(), 9)  # dies holding it
""")


def _child(run_dir, *extra: str, env=None, pass_fds=()) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", CHILD, str(run_dir), *extra],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **(env or {})},
        pass_fds=pass_fds,
    )


def test_a_held_folder_refuses_another_writer_naming_the_holder(tmp_path):
    with RunLock(tmp_path / "run", command="stare up --config x.yaml"):
        done = _child(tmp_path / "run")
    assert done.returncode == 2
    line = done.stdout.strip()
    assert line.startswith(f"refused: run folder {tmp_path / 'run'} is in use by pid {os.getpid()}")
    assert f"on host {socket.gethostname()} (stare up --config x.yaml, since 20" in line
    assert f"kill -TERM {os.getpid()}" in line and line.endswith("or choose another run.name")


def test_a_resume_clash_does_not_suggest_another_run_name(tmp_path):
    with RunLock(tmp_path / "run", command="stare train"), pytest.raises(RunLockError) as caught:
        RunLock(tmp_path / "run", resume=True).acquire()
    assert "is in use by pid" in str(caught.value) and "run.name" not in str(caught.value)


def test_the_lock_is_released_with_its_holder_and_leaves_no_record(tmp_path):
    with RunLock(tmp_path / "run"):
        pass
    assert (tmp_path / "run" / ".lock").read_text() == ""
    assert _child(tmp_path / "run").stdout.strip() == "held"


def test_a_child_given_the_locked_descriptor_writes_under_it_and_others_are_refused(tmp_path):
    """`stare up`: the launcher holds the lock; its learner, and a learner it restarts, inherit it."""
    with RunLock(tmp_path / "run", command="stare up") as lock:
        for _ in range(2):  # a first learner, then one restarted under supervision
            inherited = _child(tmp_path / "run", env=lock.child_env(), pass_fds=(lock.fd,))
            assert inherited.stdout.strip() == "inherited", inherited.stdout + inherited.stderr
        stranger = _child(tmp_path / "run", env=lock.child_env())  # the variable without the descriptor
        assert stranger.returncode == 2 and "in use by" in stranger.stdout
    assert (tmp_path / "run" / ".lock").read_text() == ""  # released by the launcher, not by its child


def test_a_delegate_with_the_holders_token_writes_under_it_and_a_wrong_token_is_refused(tmp_path):
    with RunLock(tmp_path / "run", command="stare up --target ray") as lock:
        assert _child(tmp_path / "run", env={TOKEN_ENV: lock.token}).stdout.strip() == "delegated"
        assert _child(tmp_path / "run", env={TOKEN_ENV: "not-the-token"}).returncode == 2


def test_a_dead_holders_lock_is_taken_over_with_a_warning_naming_it(tmp_path):
    died = _child(tmp_path / "run", "die")
    assert died.returncode == -signal.SIGKILL and died.stdout.strip() == "held"
    record = json.loads((tmp_path / "run" / ".lock").read_text())
    warnings: list[str] = []
    with RunLock(tmp_path / "run", say=warnings.append) as lock:
        assert lock.mode == "held"
    assert warnings == [
        f"warning: taking over the lock of run folder {tmp_path / 'run'}: its holder, pid {record['pid']} on host "
        f"{record['host']} (child, since {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(record['since']))}), "
        "is gone without releasing it"
    ]


def test_a_record_from_another_kernel_counts_while_it_is_renewed(tmp_path):
    """A run folder on a shared filesystem whose mount does not pass locks between hosts: flock is granted,
    the record of a holder on another host is trusted while its mtime is fresh, then taken over."""
    lock_file = tmp_path / "run" / ".lock"
    lock_file.parent.mkdir()
    record = {"pid": 1, "host": "node-b", "boot": "another-kernel", "command": "stare learner", "since": time.time()}
    lock_file.write_text(json.dumps(record))
    with pytest.raises(RunLockError, match=r"in use by pid 1 on host node-b \(stare learner, since"):
        RunLock(tmp_path / "run").acquire()
    old = time.time() - STALE_S - 1
    os.utime(lock_file, (old, old))
    warnings: list[str] = []
    with RunLock(tmp_path / "run", say=warnings.append) as lock:
        assert lock.mode == "held" and "pid 1 on host node-b" in warnings[0]


def test_a_holder_renews_its_record(tmp_path, monkeypatch):
    import stare.runtime.run_lock as run_lock

    monkeypatch.setattr(run_lock, "RENEW_S", 0.05)
    with RunLock(tmp_path / "run"):
        old = time.time() - 100
        os.utime(tmp_path / "run" / ".lock", (old, old))
        time.sleep(0.5)
        assert time.time() - (tmp_path / "run" / ".lock").stat().st_mtime < 5


def test_a_lock_kept_by_an_orphan_names_the_orphan(tmp_path):
    """A launcher killed while its learner runs: the record names the dead launcher, the message the
    process that still holds the descriptor."""
    script = textwrap.dedent(f"""
        import os, subprocess, sys, time
        from pathlib import Path
        from stare.runtime.run_lock import RunLock
        lock = RunLock(Path({str(tmp_path / "run")!r}), command="stare up").acquire()
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], pass_fds=(lock.fd,),
                                 start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        print(child.pid, flush=True)
        os.kill(os.getpid(), 9)
    """)
    launcher = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    orphan = int(launcher.stdout.split()[0])
    try:
        with pytest.raises(RunLockError) as caught:
            RunLock(tmp_path / "run").acquire()
        assert f"now gone; still held by pid {orphan}, which inherited it" in str(caught.value)
        assert f"kill -TERM {orphan}" in str(caught.value)
    finally:
        os.kill(orphan, signal.SIGKILL)


def test_the_inherited_descriptor_must_be_this_folders_lock(tmp_path):
    """STARE_RUN_LOCK_FD naming another file's descriptor gives no right to a held folder."""
    other = tmp_path / "other.txt"
    other.write_text("x")
    with open(other) as f, RunLock(tmp_path / "run"):
        done = _child(tmp_path / "run", env={FD_ENV: str(f.fileno())}, pass_fds=(f.fileno(),))
    assert done.returncode == 2
