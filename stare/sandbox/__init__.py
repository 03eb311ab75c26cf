"""Run untrusted Python (model-written code) in a confined child process.

Covered, with `isolation="namespaces"` (the default; needs root with CAP_SYS_ADMIN, as on our
machines and CI):
- CPU time: RLIMIT_CPU (SIGXCPU at `cpu_s`, SIGKILL one second later), per process.
- Wall time: the launcher kills the run at `wall_s`; the parent kills the launcher as a backstop.
- Memory: RLIMIT_AS (`memory_mb` of address space per process; allocation fails, Python raises
  MemoryError).
- Processes: RLIMIT_NPROC for a throwaway uid reserved for this run (root ignores RLIMIT_NPROC,
  so the program never runs as root); threads count too.
- Output: stdout + stderr capped at `max_output_bytes`; the run is stopped when it overflows.
- Files: RLIMIT_FSIZE per file, a `disk_mb` tmpfs for everything writable, RLIMIT_NOFILE.
- Network: a new, empty network namespace (not even loopback is up) and a seccomp filter that
  fails socket() for every family but AF_UNIX (unless `allow_network`).
- Filesystem: a new mount namespace whose root is a tmpfs holding read-only binds of /usr (and
  /bin, /lib via their symlinks), the interpreter's install and `readonly_paths`, a fresh /proc
  of the run's own PID namespace, /dev/{null,zero,full,random,urandom}, and the writable /work
  (cwd, holding the program) and /tmp. Nothing else of the host is visible: not /root, /home,
  /etc (a synthetic passwd/group/hosts only), the repository, or the host's /tmp.
- Environment: the program sees only a fixed minimal environment (plus `env`), never the
  parent's; the interpreter runs with -I -S -B (no PYTHON* variables, no site-packages).
- Processes are contained: new session, new PID namespace (the program cannot see or signal
  anything outside it), no_new_privs, a seccomp filter against namespace/mount/ptrace/bpf/keyring/
  io_uring calls; when the program's main process exits, the namespace's init exits and the
  kernel kills everything left (double-forked, setsid'ed daemons included).

`isolation="process"` (root without CAP_SYS_ADMIN, e.g. a default Docker container) keeps the
rlimits, the throwaway uid, seccomp (so no network), the minimal environment and the cleanup
(every process of the uid is killed and reaped), but has no mount or PID namespace: the program
can read whatever the host leaves world-readable and write to world-writable places (/tmp,
/dev/shm), and can see the host's process list. `isolation="unprivileged"` (any user) is for
trusted code only: rlimits except the process count, seccomp, cleanup of descendants; the program
runs as the calling user and can read and write that user's files.

Not covered in any mode: total memory across processes (up to max_processes x memory_mb; put a
memory limit on the container or cgroup), kernel exploits (the seccomp filter narrows the
surface, it is not gVisor), side channels, and disk written by the program being memory (the
tmpfs counts against host RAM, capped at disk_mb). Which of the limits "memory", "process" and
"file" fired is inferred from the interpreter's error text, since those limits make a call fail
rather than kill the process.
"""

from stare.sandbox.limits import (
    InMemorySandbox,
    Isolation,
    LimitName,
    Sandbox,
    SandboxConfig,
    SandboxResult,
    SandboxStatus,
    SandboxUnavailable,
)
from stare.sandbox.process import ProcessSandbox, best_isolation, probe, unavailable_reason

__all__ = [
    "InMemorySandbox",
    "Isolation",
    "LimitName",
    "ProcessSandbox",
    "Sandbox",
    "SandboxConfig",
    "SandboxResult",
    "SandboxStatus",
    "SandboxUnavailable",
    "best_isolation",
    "probe",
    "unavailable_reason",
]
