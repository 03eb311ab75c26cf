"""Sandbox launcher: the small process that confines one untrusted Python run.

Started by `stare.sandbox.ProcessSandbox` as `python -I -S -B _launcher.py SPEC`,
with the run's stdin/stdout/stderr as its own and two extra descriptors named in SPEC: `status_fd`
(JSON lines back to the parent) and `control_fd` (the parent writes one byte, or dies, to stop the
run). It uses the standard library only (no site-packages, no `stare` import), so it starts in
~20 ms and does not depend on what the untrusted code could have touched.

Modes (SPEC["mode"]):
- "namespaces" (root with CAP_SYS_ADMIN): unshare mount, PID, network, IPC and UTS namespaces;
  fork an init (PID 1 of the new PID namespace) that builds a new root on a size-capped tmpfs
  (read-only binds of /usr and the interpreter, a fresh /proc, a few /dev nodes, a writable /work
  and /tmp), pivots into it, then forks the program. When init exits the kernel kills every
  process left in the namespace, so nothing the program started survives the run.
- "process" (root without CAP_SYS_ADMIN, e.g. a default Docker container): no namespaces; the
  program runs as a throwaway uid in a 0700 work directory; at the end every process of that uid
  is killed (`kill(-1)` from that uid) and reaped (the launcher is a child subreaper).
- "unprivileged" (any user; trusted code only): rlimits, seccomp and a kill of all descendants.

In every mode the program gets rlimits (CPU, address space, file size, open files, no core
dumps; processes per uid where a uid is given), a new session, `no_new_privs`, and a seccomp
filter that denies namespace, mount, ptrace, bpf, keyring, module, io_uring and (unless network
is allowed) non-AF_UNIX sockets. The seccomp filter is built for x86_64 and aarch64 only (the
aarch64 table is taken from the kernel's generic syscall list and is untested here).

Not covered here: wall time is enforced by this launcher and, as a backstop, by the parent; total
memory across processes is max_processes x memory limit (no cgroup).
"""

import ctypes
import json
import os
import platform
import resource
import select
import shutil
import signal
import struct
import sys
import time

# --- constants (linux/sched.h, linux/mount.h, linux/prctl.h, linux/seccomp.h, linux/filter.h)
CLONE_NEWNS = 0x00020000
CLONE_NEWCGROUP = 0x02000000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000

MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_NOEXEC = 8
MS_REMOUNT = 32
MS_BIND = 4096
MS_REC = 16384
MS_PRIVATE = 1 << 18
MNT_DETACH = 2

PR_SET_PDEATHSIG = 1
PR_SET_SECCOMP = 22
PR_SET_CHILD_SUBREAPER = 36
PR_SET_NO_NEW_PRIVS = 38
SECCOMP_MODE_FILTER = 2

SECCOMP_RET_KILL_PROCESS = 0x80000000
SECCOMP_RET_ERRNO = 0x00050000
SECCOMP_RET_ALLOW = 0x7FFF0000
BPF_LD_W_ABS = 0x00 | 0x00 | 0x20
BPF_JEQ_K = 0x05 | 0x10
BPF_JGE_K = 0x05 | 0x30
BPF_JSET_K = 0x05 | 0x40
BPF_RET_K = 0x06
EPERM, EACCES, ENOSYS = 1, 13, 38
AF_UNIX = 1

# Syscall numbers: x86_64 from asm/unistd_64.h; aarch64 from asm-generic/unistd.h.
_SYSCALLS = {
    "x86_64": {
        "arch": 0xC000003E,
        "socket": 41, "clone": 56, "clone3": 435, "pivot_root": 155,
        "deny": [272, 308, 165, 166, 155, 161, 101, 310, 311, 250, 248, 249, 321, 298, 323,
                 246, 320, 175, 313, 176, 169, 167, 168, 163, 103, 425, 426, 427, 428, 429,
                 430, 431, 432, 433, 442, 179, 304, 303, 172, 173],
    },
    "aarch64": {
        "arch": 0xC00000B7,
        "socket": 198, "clone": 220, "clone3": 435, "pivot_root": 41,
        "deny": [97, 268, 40, 39, 41, 51, 117, 270, 271, 219, 217, 218, 280, 241, 282, 104,
                 294, 105, 273, 106, 142, 224, 225, 89, 116, 425, 426, 427, 428, 429, 430, 431,
                 432, 433, 442, 60, 265, 264],
    },
}
_NS_FLAGS = (CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWIPC
             | CLONE_NEWUTS | CLONE_NEWCGROUP)

_libc = ctypes.CDLL(None, use_errno=True)


def _check(ret: int, what: str) -> int:
    if ret == -1:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")
    return ret


def _b(path):
    return None if path is None else os.fsencode(path)


def _mount(src, dst, fstype, flags, data=None) -> None:
    _check(_libc.mount(_b(src), _b(dst), _b(fstype), ctypes.c_ulong(flags), _b(data)),
           f"mount {src} -> {dst}")


def _prctl(option: int, arg2: int = 0) -> None:
    _check(_libc.prctl(option, ctypes.c_ulong(arg2), ctypes.c_ulong(0), ctypes.c_ulong(0),
                       ctypes.c_ulong(0)), f"prctl({option})")


# --- seccomp -----------------------------------------------------------------------------------

def _seccomp_program(allow_network: bool, allow_unix_sockets: bool) -> list[tuple[int, int, int, int]]:
    table = _SYSCALLS[platform.machine()]
    prog = [
        (BPF_LD_W_ABS, 0, 0, 4),                       # A = seccomp_data.arch
        (BPF_JEQ_K, 1, 0, table["arch"]),              # native arch: skip the kill
        (BPF_RET_K, 0, 0, SECCOMP_RET_KILL_PROCESS),
        (BPF_LD_W_ABS, 0, 0, 0),                       # A = seccomp_data.nr
    ]
    if platform.machine() == "x86_64":                 # x32 ABI aliases: kill
        prog += [(BPF_JGE_K, 0, 1, 0x40000000), (BPF_RET_K, 0, 0, SECCOMP_RET_KILL_PROCESS)]
    for nr in sorted(set(table["deny"])):
        prog += [(BPF_JEQ_K, 0, 1, nr), (BPF_RET_K, 0, 0, SECCOMP_RET_ERRNO | EPERM)]
    # clone3 passes its flags in memory a filter cannot read: ENOSYS makes libc fall back to clone.
    prog += [(BPF_JEQ_K, 0, 1, table["clone3"]), (BPF_RET_K, 0, 0, SECCOMP_RET_ERRNO | ENOSYS)]
    # clone: deny any namespace flag (args[0], low 32 bits at offset 16).
    prog += [
        (BPF_JEQ_K, 0, 4, table["clone"]),
        (BPF_LD_W_ABS, 0, 0, 16),
        (BPF_JSET_K, 0, 1, _NS_FLAGS),
        (BPF_RET_K, 0, 0, SECCOMP_RET_ERRNO | EPERM),
        (BPF_RET_K, 0, 0, SECCOMP_RET_ALLOW),
    ]
    if not allow_network:
        # socket(domain, ...): AF_UNIX only (when allowed); every other family gets EACCES.
        allowed_family = AF_UNIX if allow_unix_sockets else 0xFFFFFFFF
        prog += [
            (BPF_JEQ_K, 0, 4, table["socket"]),
            (BPF_LD_W_ABS, 0, 0, 16),
            (BPF_JEQ_K, 0, 1, allowed_family),
            (BPF_RET_K, 0, 0, SECCOMP_RET_ALLOW),
            (BPF_RET_K, 0, 0, SECCOMP_RET_ERRNO | EACCES),
        ]
    prog.append((BPF_RET_K, 0, 0, SECCOMP_RET_ALLOW))
    return prog


def _install_seccomp(allow_network: bool, allow_unix_sockets: bool) -> None:
    prog = _seccomp_program(allow_network, allow_unix_sockets)
    raw = b"".join(struct.pack("HBBI", *ins) for ins in prog)
    buf = ctypes.create_string_buffer(raw, len(raw))

    class SockFprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    fprog = SockFprog(len(prog), ctypes.addressof(buf))
    _check(_libc.prctl(PR_SET_SECCOMP, ctypes.c_ulong(SECCOMP_MODE_FILTER),
                       ctypes.byref(fprog), ctypes.c_ulong(0), ctypes.c_ulong(0)), "seccomp")


# --- the program -------------------------------------------------------------------------------

def _exec_program(spec: dict, workdir: str, status_fd: int) -> None:
    """In the forked child: drop everything, then exec the interpreter. Never returns."""
    try:
        os.setsid()
        rl = spec["rlimits"]
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        resource.setrlimit(resource.RLIMIT_CPU, tuple(rl["cpu"]))
        resource.setrlimit(resource.RLIMIT_AS, (rl["as"], rl["as"]))
        resource.setrlimit(resource.RLIMIT_FSIZE, (rl["fsize"], rl["fsize"]))
        resource.setrlimit(resource.RLIMIT_NOFILE, (rl["nofile"], rl["nofile"]))
        if rl.get("nproc") is not None:
            resource.setrlimit(resource.RLIMIT_NPROC, (rl["nproc"], rl["nproc"]))
        if spec["uid"] is not None:
            os.setgroups([])
            os.setresgid(spec["gid"], spec["gid"], spec["gid"])
            os.setresuid(spec["uid"], spec["uid"], spec["uid"])
        _prctl(PR_SET_NO_NEW_PRIVS, 1)
        _install_seccomp(spec["allow_network"], allow_unix_sockets=spec["mode"] == "namespaces")
        os.chdir(workdir)
        os.umask(0o077)
        os.execve(spec["argv"][0], spec["argv"], spec["env"])
    except BaseException as exc:  # noqa: BLE001 - report any setup failure to the parent
        _report(status_fd, {"setup_error": f"exec: {exc!r}"})
    os._exit(127)


def _report(status_fd: int, record: dict) -> None:
    try:
        os.write(status_fd, (json.dumps(record) + "\n").encode())
    except OSError:
        pass


def _exit_record(status: int, rusage) -> dict:
    rec = {"cpu_s": rusage.ru_utime + rusage.ru_stime, "max_rss_kb": rusage.ru_maxrss}
    if os.WIFSIGNALED(status):
        rec.update(exit_code=None, signal=os.WTERMSIG(status))
    else:
        rec.update(exit_code=os.waitstatus_to_exitcode(status), signal=None)
    return rec


# --- namespaces mode ----------------------------------------------------------------------------

def _bind_ro(src: str, root: str) -> None:
    dst = root + src
    if os.path.isdir(src):
        os.makedirs(dst, exist_ok=True)
    else:
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        open(dst, "a").close()
    _mount(src, dst, None, MS_BIND)
    _mount(None, dst, None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)


def _build_root(spec: dict) -> None:
    """Build the new root under staging/root and pivot into it (init, new mount namespace)."""
    staging = spec["staging"]
    root = os.path.join(staging, "root")
    uid, gid = spec["uid"], spec["gid"]
    _mount(None, "/", None, MS_REC | MS_PRIVATE)       # nothing below propagates to the host
    _mount("tmpfs", root, "tmpfs", MS_NOSUID | MS_NODEV,
           f"size={spec['disk_bytes']},nr_inodes=4096,mode=0755")
    for top in ("bin", "sbin", "lib", "lib64", "lib32", "libx32"):
        host = "/" + top
        if os.path.islink(host):
            os.symlink(os.readlink(host), os.path.join(root, top))
        elif os.path.isdir(host):
            _bind_ro(host, root)
    for path in ["/usr", *spec["ro_paths"]]:
        if os.path.exists(path):
            _bind_ro(path, root)
    # /etc: only what the dynamic loader and Python need, plus a passwd entry for the uid.
    etc = os.path.join(root, "etc")
    os.makedirs(etc)
    for name in ("ld.so.cache", "ld.so.conf"):
        if os.path.isfile("/etc/" + name):
            _bind_ro("/etc/" + name, root)
    if os.path.islink("/etc/localtime"):
        os.symlink(os.readlink("/etc/localtime"), os.path.join(etc, "localtime"))
    with open(os.path.join(etc, "passwd"), "w") as f:
        f.write(f"root:x:0:0::/:/bin/false\nsandbox:x:{uid}:{gid}::/work:/bin/false\n")
    with open(os.path.join(etc, "group"), "w") as f:
        f.write(f"root:x:0:\nsandbox:x:{gid}:\n")
    with open(os.path.join(etc, "hosts"), "w") as f:
        f.write("127.0.0.1 localhost\n")
    if spec["allow_network"] and os.path.isfile("/etc/resolv.conf"):
        _bind_ro("/etc/resolv.conf", root)
    # /dev: a handful of character devices, bound from the host.
    dev = os.path.join(root, "dev")
    os.makedirs(dev)
    for name in ("null", "zero", "full", "random", "urandom"):
        open(os.path.join(dev, name), "a").close()
        _mount("/dev/" + name, os.path.join(dev, name), None, MS_BIND)
    os.makedirs(os.path.join(dev, "shm"), mode=0o1777)
    os.chmod(os.path.join(dev, "shm"), 0o1777)
    for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"),
                         ("stdout", "/proc/self/fd/1"), ("stderr", "/proc/self/fd/2")):
        os.symlink(target, os.path.join(dev, name))
    os.makedirs(os.path.join(root, "proc"))
    _mount("proc", os.path.join(root, "proc"), "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    tmp = os.path.join(root, "tmp")
    os.makedirs(tmp)
    os.chmod(tmp, 0o1777)
    # /work: the program's files, owned by its uid.
    work = os.path.join(root, "work")
    shutil.copytree(os.path.join(staging, "files"), work)
    os.chmod(work, 0o700)
    for dirpath, dirnames, filenames in os.walk(work):
        os.chown(dirpath, uid, gid)
        for name in filenames:
            os.chown(os.path.join(dirpath, name), uid, gid)
    os.chdir(root)
    table = _SYSCALLS.get(platform.machine())
    if table is None:
        raise OSError(f"no pivot_root syscall number for {platform.machine()}")
    _check(_libc.syscall(ctypes.c_long(table["pivot_root"]), b".", b"."), "pivot_root")
    _check(_libc.umount2(b".", MNT_DETACH), "umount old root")
    os.chdir("/")
    name = b"sandbox"
    _check(_libc.sethostname(name, len(name)), "sethostname")


def _init(spec: dict, lifeline_r: int, status_fd: int, control_fd: int) -> None:
    """PID 1 of the new PID namespace: build the root, run the program, report. Never returns."""
    try:
        _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        os.set_blocking(lifeline_r, False)
        try:
            if os.read(lifeline_r, 1) == b"":          # launcher already gone
                os._exit(1)
        except BlockingIOError:
            pass
        os.close(lifeline_r)
        os.close(control_fd)
        _build_root(spec)
        child = os.fork()
        if child == 0:
            _exec_program(spec, "/work", status_fd)
        while True:
            pid, status, rusage = os.wait4(-1, 0)
            if pid == child:
                _report(status_fd, _exit_record(status, rusage))
                break
    except BaseException as exc:  # noqa: BLE001 - report any setup failure to the parent
        _report(status_fd, {"setup_error": f"namespaces: {exc!r}"})
        os._exit(70)
    os._exit(0)                                         # the kernel now kills the namespace


# --- the launcher -------------------------------------------------------------------------------

def _wait_or_stop(pid: int, control_fd: int, wall_s: float) -> str | None:
    """Wait for `pid` to exit; return why we must stop it early ("wall_s", "parent") or None."""
    pidfd = os.pidfd_open(pid)
    deadline = time.monotonic() + wall_s
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return "wall_s"
            ready, _, _ = select.select([pidfd, control_fd], [], [], left)
            if pidfd in ready:
                return None
            if control_fd in ready:
                os.read(control_fd, 1)                 # a byte or EOF: stop either way
                return "parent"
    finally:
        os.close(pidfd)


def _kill_uid(uid: int) -> None:
    """Kill every process of `uid`, from a helper that runs as that uid (kill(-1))."""
    helper = os.fork()
    if helper == 0:
        try:
            os.setresgid(uid, uid, uid)
            os.setresuid(uid, uid, uid)
            for _ in range(100):
                os.kill(-1, signal.SIGKILL)
        except ProcessLookupError:
            pass
        except BaseException:  # noqa: BLE001
            os._exit(1)
        os._exit(0)
    os.waitpid(helper, 0)


def _kill_children() -> None:
    """SIGKILL every live process whose parent is this process (found through /proc)."""
    me = os.getpid()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rfind(b")") + 2:].split()
        if int(fields[1]) == me and fields[0] != b"Z":
            try:
                os.kill(int(entry), signal.SIGKILL)
            except ProcessLookupError:
                pass


def _sweep(uid: int | None, timeout_s: float = 3.0) -> bool:
    """Kill and reap everything the program left behind; True once no child is left.

    The launcher is a child subreaper, so every process the program started (detached or not)
    is a descendant of it and is re-parented to it when its own parent dies: once waitpid says
    there is no child left, nothing of the run is alive.
    """
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if uid is not None:
            _kill_uid(uid)
        else:
            _kill_children()
        while True:
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return True
            if pid == 0:
                break
        time.sleep(0.002)
    return False


def main() -> int:
    spec = json.loads(sys.argv[1])
    if "sweep_uid" in spec:                             # the parent's backstop cleanup
        _kill_uid(spec["sweep_uid"])
        return 0
    try:
        return _launch(spec)
    except BaseException as exc:  # noqa: BLE001 - the parent reads the reason, not a traceback
        _report(spec["status_fd"], {"setup_error": f"launcher: {exc!r}"})
        return 70


def _launch(spec: dict) -> int:
    status_fd, control_fd = spec["status_fd"], spec["control_fd"]
    os.set_inheritable(status_fd, False)
    os.set_inheritable(control_fd, False)
    mode = spec["mode"]
    if mode == "namespaces":
        flags = CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS
        if not spec["allow_network"]:
            flags |= CLONE_NEWNET
        try:
            _check(_libc.unshare(flags), "unshare")
        except OSError as exc:
            _report(status_fd, {"setup_error": f"namespaces: {exc}"})
            return 70
        lifeline_r, lifeline_w = os.pipe()
        child = os.fork()
        if child == 0:
            os.close(lifeline_w)
            _init(spec, lifeline_r, status_fd, control_fd)
        os.close(lifeline_r)
        reason = _wait_or_stop(child, control_fd, spec["wall_s"])
        if reason is not None:
            os.kill(child, signal.SIGKILL)              # init dies: the namespace goes with it
            _report(status_fd, {"stopped": reason})
        os.waitpid(child, 0)
        return 0

    # "process" and "unprivileged": no namespaces; the launcher is a subreaper.
    _prctl(PR_SET_CHILD_SUBREAPER, 1)
    if spec["uid"] is not None:
        _kill_uid(spec["uid"])                          # leftovers of a crashed earlier run
    workdir = os.path.join(spec["staging"], "work")
    os.rename(os.path.join(spec["staging"], "files"), workdir)
    if spec["uid"] is not None:
        os.chmod(spec["staging"], 0o711)
        for dirpath, dirnames, filenames in os.walk(workdir):
            os.chown(dirpath, spec["uid"], spec["gid"])
            for name in filenames:
                os.chown(os.path.join(dirpath, name), spec["uid"], spec["gid"])
        os.chmod(workdir, 0o700)
    os.makedirs(os.path.join(workdir, ".tmp"), exist_ok=True)
    if spec["uid"] is not None:
        os.chown(os.path.join(workdir, ".tmp"), spec["uid"], spec["gid"])
    child = os.fork()
    if child == 0:
        os.close(control_fd)
        _exec_program(spec, workdir, status_fd)
    reason = _wait_or_stop(child, control_fd, spec["wall_s"])
    if reason is not None:
        _report(status_fd, {"stopped": reason})
    for kill in (os.kill, os.killpg):                  # the program, then its process group
        try:
            kill(child, signal.SIGKILL)
        except ProcessLookupError:
            pass
    _, status, rusage = os.wait4(child, 0)
    _report(status_fd, _exit_record(status, rusage))
    if not _sweep(spec["uid"]):
        _report(status_fd, {"setup_error": "processes of the run survived the sweep"})
    return 0

if __name__ == "__main__":
    sys.exit(main())
