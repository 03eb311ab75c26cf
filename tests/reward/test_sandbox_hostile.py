"""Hostile programs against the sandbox: one attack per test, each must be contained.

Every case runs under "namespaces" (the default isolation) and, where the module docstring of
`stare.sandbox` says the property holds there too, under "process". Limits are ~1-2 s so
the whole file runs in about 15 s. Needs root (CI runs as root); elsewhere the cases skip, except
under CI=true where a missing capability is a failure.
"""

import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from stare.sandbox import ProcessSandbox, SandboxConfig, probe

BOTH = ["namespaces", "process"]
REPO = Path(__file__).resolve().parents[2]


def _sandbox(isolation: str, **limits) -> ProcessSandbox:
    reason = probe(isolation)
    if reason is not None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"sandbox isolation {isolation!r} unavailable on CI: {reason}")
        pytest.skip(reason)
    # wall_s is generous: the machine is shared, and a loaded core must not flip a verdict.
    defaults = dict(
        cpu_s=5, wall_s=10.0, memory_mb=256, max_processes=8, max_output_bytes=64 * 1024, max_file_mb=4, disk_mb=16
    )
    return ProcessSandbox(SandboxConfig(isolation=isolation, **{**defaults, **limits}))


def _cmdlines_containing(marker: str) -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if marker.encode() in Path(f"/proc/{entry}/cmdline").read_bytes():
                    pids.append(int(entry))
            except OSError:
                pass
    return pids


def _uids_alive(first: int, count: int) -> list[int]:
    """Host pids whose real uid is in [first, first + count)."""
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                status = Path(f"/proc/{entry}/status").read_text()
            except OSError:
                continue
            uid = int(next(line for line in status.splitlines() if line.startswith("Uid:")).split()[1])
            if first <= uid < first + count:
                pids.append(int(entry))
    return pids


# --- time ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("isolation", BOTH)
def test_infinite_loop_is_stopped_by_the_cpu_limit(isolation):
    result = _sandbox(isolation, cpu_s=1, wall_s=20.0).run("while True:\n    pass\n")
    assert (result.status, result.limit_fired) == ("timeout", "cpu_s")
    # it ran until the limit (not stopped early by the wall clock); the kernel's RLIMIT_CPU check and the
    # rusage we report sample CPU time differently, by up to a scheduler tick or so (CI saw 0.9941)
    assert result.cpu_s >= 0.95


@pytest.mark.parametrize("isolation", BOTH)
def test_sleep_forever_is_stopped_by_the_wall_limit(isolation):
    result = _sandbox(isolation, wall_s=1.0).run("import time\ntime.sleep(3600)\n")
    assert (result.status, result.limit_fired) == ("timeout", "wall_s")
    assert 1.0 <= result.wall_s < 10.0  # the sleep is an hour: it was stopped near the limit


# --- processes -----------------------------------------------------------------------------------


@pytest.mark.parametrize("isolation", BOTH)
def test_fork_bomb_is_stopped_by_the_process_limit_and_leaves_nothing(isolation):
    base = 1_700_000  # a uid range of its own, so leftovers are attributable to this test
    sandbox = _sandbox(isolation, max_processes=8, uid_base=base, uid_slots=16)
    result = sandbox.run("import os\nwhile True:\n    os.fork()\n")
    assert (result.status, result.limit_fired) == ("process_limit", "max_processes")
    assert _uids_alive(base, 16) == []


@pytest.mark.parametrize("isolation", BOTH)
def test_thread_bomb_hits_the_process_limit(isolation):
    code = (
        "import threading\n"
        "ev = threading.Event()\n"
        "ts = [threading.Thread(target=ev.wait) for _ in range(100)]\n"
        "try:\n"
        "    [t.start() for t in ts]\n"
        "finally:\n"
        "    ev.set()\n"
    )
    result = _sandbox(isolation, max_processes=8).run(code)
    assert (result.status, result.limit_fired) == ("process_limit", "max_processes")


@pytest.mark.parametrize("isolation", BOTH)
def test_detached_daemon_does_not_outlive_the_run(isolation):
    marker = f"stare-daemon-{uuid.uuid4().hex}"
    code = f"""
import os, sys, time
r, w = os.pipe()
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.close(r)
        os.write(w, b"x")
        os.execv(sys.executable, [sys.executable, "-c", "import time; time.sleep(60)", "{marker}"])
    os._exit(0)
os.close(w)
os.read(r, 1)
time.sleep(0.3)
print("spawned")
"""
    result = _sandbox(isolation).run(code)
    assert result.status == "ok" and result.stdout == "spawned\n"
    assert _cmdlines_containing(marker) == []


@pytest.mark.parametrize("isolation", BOTH)
def test_signalling_the_parent_and_the_test_process_is_refused(isolation):
    code = f"""
import os, signal
for pid in (os.getppid(), {os.getpid()}):
    try:
        os.kill(pid, signal.SIGKILL)
        print("signalled", pid)
    except (PermissionError, ProcessLookupError) as exc:
        print(type(exc).__name__)
"""
    result = _sandbox(isolation).run(code)
    assert result.status == "ok"
    assert "signalled" not in result.stdout
    assert len(result.stdout.splitlines()) == 2


@pytest.mark.parametrize("isolation", BOTH)
def test_kill_everything_reaches_no_host_process(isolation):
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        code = "import os, signal\ntry:\n    os.kill(-1, signal.SIGKILL)\nexcept ProcessLookupError:\n    pass\n"
        result = _sandbox(isolation).run(code)
        assert result.status == "ok"
        assert bystander.poll() is None
    finally:
        bystander.kill()
        bystander.wait()


def test_host_processes_are_invisible():
    code = "import os\nprint(sorted(int(p) for p in os.listdir('/proc') if p.isdigit()))\n"
    result = _sandbox("namespaces").run(code)
    assert result.stdout == "[1, 2]\n"  # the namespace's init and the program itself


@pytest.mark.parametrize("isolation", BOTH)
def test_creating_a_user_namespace_is_refused(isolation):
    code = (
        "import ctypes, os\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "print(libc.unshare(0x10000000), os.strerror(ctypes.get_errno()))\n"
    )
    result = _sandbox(isolation).run(code)
    assert result.stdout == "-1 Operation not permitted\n"


@pytest.mark.parametrize("isolation", BOTH)
def test_setuid_binaries_cannot_raise_privileges(isolation):
    # no_new_privs makes the kernel ignore setuid bits and file capabilities on exec.
    code = (
        "flags = dict(line.split(':\\t') for line in open('/proc/self/status').read().splitlines()"
        " if ':\\t' in line)\n"
        "print(flags['NoNewPrivs'].strip(), flags['Seccomp'].strip())\n"
    )
    result = _sandbox(isolation).run(code)
    assert result.stdout == "1 2\n"  # no_new_privs on; seccomp in filter mode


# --- memory, output, files ---------------------------------------------------------------------


@pytest.mark.parametrize("isolation", BOTH)
@pytest.mark.parametrize(
    "code",
    [
        "x = bytearray(1 << 30)\n",
        "chunks = []\nwhile True:\n    chunks.append(' ' * 10**6)\n",
    ],
    ids=["one-allocation", "growing-list"],
)
def test_memory_bomb_is_stopped_by_the_memory_limit(isolation, code):
    result = _sandbox(isolation, memory_mb=256).run(code)
    assert (result.status, result.limit_fired) == ("memory", "memory_mb")


@pytest.mark.parametrize("isolation", BOTH)
@pytest.mark.parametrize("stream", ["stdout", "stderr"])
def test_output_flood_is_cut_at_the_output_limit(isolation, stream):
    code = f"import sys\nwhile True:\n    sys.{stream}.write('x' * 1000)\n"
    result = _sandbox(isolation, max_output_bytes=64 * 1024).run(code)
    assert (result.status, result.limit_fired) == ("output_limit", "max_output_bytes")
    assert len(result.stdout) + len(result.stderr) == 64 * 1024


@pytest.mark.parametrize("isolation", BOTH)
def test_big_file_is_stopped_by_the_file_size_limit(isolation):
    result = _sandbox(isolation, max_file_mb=4).run("open('big', 'wb').write(b'x' * (8 << 20))\n")
    assert (result.status, result.limit_fired) == ("file_limit", "max_file_mb")


def test_many_files_fill_only_the_runs_own_tmpfs():
    code = "i = 0\nwhile True:\n    open(f'f{i}', 'wb').write(b'x' * (1 << 20))\n    i += 1\n"
    result = _sandbox("namespaces", disk_mb=8, max_file_mb=4).run(code)
    assert (result.status, result.limit_fired) == ("file_limit", "max_file_mb")
    assert "No space left on device" in result.stderr


# --- network -------------------------------------------------------------------------------------


@pytest.fixture
def listener():
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    server.settimeout(0.3)
    yield server
    server.close()


def _connected(server: socket.socket) -> bool:
    try:
        conn, _ = server.accept()
    except TimeoutError:
        return False
    conn.close()
    return True


_CONNECT = """
import socket
try:
    socket.create_connection(("127.0.0.1", {port}), timeout=1).sendall(b"leak")
    print("connected")
except OSError as exc:
    print(type(exc).__name__)
"""


@pytest.mark.parametrize("isolation", BOTH)
def test_connecting_to_a_loopback_listener_fails(isolation, listener):
    result = _sandbox(isolation).run(_CONNECT.format(port=listener.getsockname()[1]))
    assert result.stdout == "PermissionError\n"
    assert not _connected(listener)


def test_allow_network_reaches_the_loopback_listener(listener):
    """The control for the case above: the listener does see a sandbox that may connect."""
    sandbox = _sandbox("namespaces", allow_network=True)
    result = sandbox.run(_CONNECT.format(port=listener.getsockname()[1]))
    assert result.stdout == "connected\n"
    assert _connected(listener)


@pytest.mark.parametrize("isolation", BOTH)
@pytest.mark.parametrize("family", ["AF_INET", "AF_INET6", "AF_PACKET", "AF_NETLINK"])
def test_no_socket_can_be_created_for_external_traffic(isolation, family):
    # 192.0.2.1 is TEST-NET-1 (never routed); socket() must fail before anything could be sent.
    code = f"""
import socket
try:
    s = socket.socket(socket.{family}, socket.SOCK_DGRAM if "{family}".startswith("AF_INET") else socket.SOCK_RAW)
    if "{family}" == "AF_INET":
        s.sendto(b"x", ("192.0.2.1", 9))
    print("created")
except OSError as exc:
    print(type(exc).__name__)
"""
    result = _sandbox(isolation).run(code)
    assert result.stdout == "PermissionError\n"


def test_network_namespace_has_only_a_down_loopback():
    result = _sandbox("namespaces").run("print(open('/proc/net/dev').read())")
    interfaces = [line.split(":")[0].strip() for line in result.stdout.splitlines()[2:] if line]
    assert interfaces == ["lo"]


# --- host files and environment -----------------------------------------------------------------


@pytest.mark.parametrize(
    "isolation,mode",
    [
        ("namespaces", 0o600),
        ("namespaces", 0o644),
        ("process", 0o600),
    ],
)
@pytest.mark.parametrize("where", ["tmp", "repo"])
def test_host_secret_file_cannot_be_read(isolation, mode, where, tmp_path):
    secret = uuid.uuid4().hex
    path = (tmp_path if where == "tmp" else REPO) / f".stare-test-secret-{secret[:8]}"
    path.write_text(secret)
    path.chmod(mode)
    try:
        code = f"""
try:
    print(open({str(path)!r}).read())
except OSError as exc:
    print(type(exc).__name__)
"""
        result = _sandbox(isolation).run(code)
    finally:
        path.unlink()
    assert secret not in result.stdout + result.stderr
    assert result.stdout in ("FileNotFoundError\n", "PermissionError\n")


@pytest.mark.parametrize("isolation", BOTH)
def test_etc_shadow_cannot_be_read(isolation):
    code = "try:\n    print(open('/etc/shadow').read())\nexcept OSError as exc:\n    print(type(exc).__name__)\n"
    result = _sandbox(isolation).run(code)
    assert result.stdout in ("FileNotFoundError\n", "PermissionError\n")


@pytest.mark.parametrize("isolation", BOTH)
def test_parent_environment_is_not_visible(isolation, monkeypatch):
    secret = uuid.uuid4().hex
    monkeypatch.setenv("STARE_TEST_SECRET", secret)
    code = """
import os
print(dict(os.environ))
for entry in os.listdir("/proc"):
    try:
        print(open(f"/proc/{entry}/environ", "rb").read())
    except OSError:
        pass
"""
    result = _sandbox(isolation).run(code)
    assert result.status == "ok"
    assert "STARE_TEST_SECRET" not in result.stdout and secret not in result.stdout


@pytest.mark.parametrize(
    "isolation,target",
    [
        ("namespaces", "{tmp}/escape"),
        ("process", "{tmp}/escape"),
        ("namespaces", "{repo}/escape"),
        ("process", "{repo}/escape"),
        ("namespaces", "/usr/escape"),
        ("process", "/usr/escape"),
        ("namespaces", "/etc/escape"),
        ("process", "/etc/escape"),
        ("namespaces", "/tmp/{name}"),  # the program's /tmp is its own ("process" shares the host's)
    ],
)
def test_writing_outside_the_work_directory_leaves_the_host_untouched(isolation, target, tmp_path):
    name = f"stare-escape-{uuid.uuid4().hex}"
    path = Path(target.format(tmp=tmp_path, repo=REPO, name=name))
    if path.name == "escape":
        path = path.with_name(name)
    code = f"""
try:
    open({str(path)!r}, "w").write("escaped")
    print("written")
except OSError as exc:
    print(type(exc).__name__)
"""
    try:
        result = _sandbox(isolation).run(code)
        assert not path.exists()
        if not str(path).startswith("/tmp/stare-escape-"):
            assert result.stdout in ("FileNotFoundError\n", "PermissionError\n", "OSError\n")
    finally:
        path.unlink(missing_ok=True)


def test_system_paths_are_read_only_even_where_permissions_would_allow():
    # /usr is root's, so DAC alone refuses the uid; the mount is read-only besides.
    code = "import os\nprint(os.statvfs('/usr').f_flag & os.ST_RDONLY)\n"
    result = _sandbox("namespaces").run(code)
    assert result.stdout == "1\n"


def test_runs_as_a_throwaway_uid_not_root():
    result = _sandbox("namespaces").run("import os\nprint(os.getuid(), os.geteuid(), os.getgid())\n")
    uid, euid, gid = map(int, result.stdout.split())
    assert uid == euid == gid and uid >= 1000


def test_stopping_mid_run_kills_the_program(monkeypatch):
    """A run abandoned by its caller (an exception in the parent) still ends its processes."""
    marker = f"stare-abandoned-{uuid.uuid4().hex}"
    sandbox = _sandbox("namespaces", wall_s=30.0)

    class Abandoned(Exception):
        pass

    def interrupt(*_):
        raise Abandoned

    old = signal.signal(signal.SIGALRM, interrupt)
    signal.setitimer(signal.ITIMER_REAL, 0.6)
    try:
        with pytest.raises(Abandoned):
            sandbox.run(
                f"import os, sys\nos.execv(sys.executable, [sys.executable, '-c', "
                f"'import time; time.sleep(60)', '{marker}'])\n"
            )
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    time.sleep(0.1)
    assert _cmdlines_containing(marker) == []
