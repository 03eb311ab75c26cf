"""The sandbox's seam: its limits (`SandboxConfig`), its verdict (`SandboxResult`), the `Sandbox`
protocol and the in-memory implementation for tests."""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field, field_validator

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

Isolation = Literal["namespaces", "process", "unprivileged"]
SandboxStatus = Literal[
    "ok",  # exit code 0
    "error",  # non-zero exit, no limit recognised
    "timeout",  # cpu_s or wall_s
    "memory",  # memory_mb (MemoryError)
    "process_limit",  # max_processes (fork/thread creation failed)
    "file_limit",  # max_file_mb / disk_mb (EFBIG, ENOSPC)
    "output_limit",  # max_output_bytes
    "killed",  # ended by a signal no limit explains
    "sandbox_error",  # the sandbox itself failed; the program's outcome is unknown
]
LimitName = Literal["cpu_s", "wall_s", "memory_mb", "max_processes", "max_file_mb", "max_output_bytes"]


class SandboxUnavailable(RuntimeError):
    """The requested isolation cannot be set up on this machine (the message says the fix)."""


class SandboxConfig(BaseModel):
    """Limits and isolation of one sandboxed run; every field is bounded."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True, allow_inf_nan=False)

    isolation: Isolation = "namespaces"
    """"namespaces" (root + CAP_SYS_ADMIN; full isolation), "process" (root; no filesystem or PID
    isolation), "unprivileged" (any user; trusted code only). See the module docstring."""
    cpu_s: int = Field(2, ge=1, le=3600)
    """CPU seconds per process (RLIMIT_CPU; whole seconds)."""
    wall_s: float = Field(5.0, gt=0, le=3600)
    """Wall-clock seconds for the whole run, from the program's start."""
    memory_mb: int = Field(512, ge=32, le=1 << 20)
    """Address space per process in MiB (RLIMIT_AS)."""
    max_processes: int = Field(16, ge=1, le=4096)
    """Processes and threads of the run's uid at once (RLIMIT_NPROC; not in "unprivileged")."""
    max_output_bytes: int = Field(1 << 20, ge=1024, le=1 << 30)
    """stdout + stderr bytes kept; the run is stopped when the program writes more."""
    max_file_mb: int = Field(16, ge=1, le=1 << 20)
    """Largest file the program may write, in MiB (RLIMIT_FSIZE)."""
    disk_mb: int = Field(64, ge=1, le=1 << 20)
    """Size of the tmpfs that holds /work and /tmp, in MiB ("namespaces" only)."""
    max_open_files: int = Field(64, ge=16, le=1 << 20)
    """Open file descriptors per process (RLIMIT_NOFILE)."""
    allow_network: bool = False
    """Keep the host network and allow every socket family (off: no network at all)."""
    python_executable: str | None = None
    """Interpreter for the program; None: the interpreter running this code (its base install,
    not a virtual environment). Its install prefix is exposed read-only."""
    readonly_paths: tuple[str, ...] = ()
    """Extra absolute host paths exposed read-only at the same place ("namespaces" only)."""
    env: dict[str, str] = Field(default_factory=dict)
    """Extra environment variables for the program (the rest is fixed and minimal)."""
    uid_base: int = Field(1_000_000, ge=1000, le=2**31 - 2**17)
    """First of the throwaway uids; one is reserved per concurrent run."""
    uid_slots: int = Field(1024, ge=1, le=65536)
    """How many throwaway uids (concurrent runs per machine)."""

    @field_validator("readonly_paths")
    @classmethod
    def _absolute(cls, paths: tuple[str, ...]) -> tuple[str, ...]:
        for p in paths:
            if not os.path.isabs(p) or ".." in Path(p).parts:
                raise ValueError(f"readonly_paths: {p!r} must be an absolute path without '..'")
        return paths

    @field_validator("env")
    @classmethod
    def _env_names(cls, env: dict[str, str]) -> dict[str, str]:
        for name, value in env.items():
            if not _ENV_NAME.match(name) or "\0" in value:
                raise ValueError(f"env: {name!r} is not a valid variable name (or has a NUL)")
        return env


class SandboxResult(BaseModel):
    """What one run did. `stdout`/`stderr` are decoded (UTF-8, invalid bytes replaced) and cut
    at the output limit; `limit_fired` names the SandboxConfig field whose limit ended the run."""

    model_config = ConfigDict(frozen=True)

    status: SandboxStatus
    exit_code: int | None
    signal: int | None = None
    stdout: str = ""
    stderr: str = ""
    output_truncated: bool = False
    limit_fired: LimitName | None = None
    wall_s: float = 0.0
    cpu_s: float = 0.0
    """CPU seconds of everything in the run, including ~0.05 s of sandbox setup."""
    detail: str | None = None
    """Why the sandbox failed (status "sandbox_error"), or other notes."""

    @property
    def ok(self) -> bool:
        return self.status == "ok"


class Sandbox(Protocol):
    """Runs one Python program under limits; implementations never raise for what it does."""

    def run(
        self, code: str, *, stdin: bytes | str = b"", files: Mapping[str, bytes | str] | None = None
    ) -> SandboxResult: ...


class InMemorySandbox:
    """A `Sandbox` that runs nothing: answers come from `respond(code, stdin)`. For unit tests of
    code that takes a sandbox (verifiers, scoring), not for executing anything."""

    def __init__(self, respond: Callable[[str, bytes], SandboxResult]):
        self._respond = respond

    def run(
        self, code: str, *, stdin: bytes | str = b"", files: Mapping[str, bytes | str] | None = None
    ) -> SandboxResult:
        return self._respond(code, stdin.encode() if isinstance(stdin, str) else stdin)
