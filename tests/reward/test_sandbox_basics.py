"""The sandbox's ordinary behaviour: stdin, files, exit codes, config bounds, verdicts."""

import os
import signal

import pytest
from pydantic import ValidationError

from stare.sandbox import InMemorySandbox, ProcessSandbox, SandboxConfig, SandboxResult, SandboxUnavailable, probe
from stare.sandbox.output import _limit_from_stderr


def _sandbox(**fields) -> ProcessSandbox:
    isolation = fields.pop("isolation", "namespaces")
    reason = probe(isolation)
    if reason is not None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"sandbox isolation {isolation!r} unavailable on CI: {reason}")
        pytest.skip(reason)
    return ProcessSandbox(SandboxConfig(isolation=isolation, wall_s=10.0, **fields))


@pytest.mark.parametrize("isolation", ["namespaces", "process", "unprivileged"])
def test_program_reads_stdin_and_writes_stdout(isolation):
    result = _sandbox(isolation=isolation).run("print(input()[::-1])", stdin="olleh\n")
    assert (result.status, result.stdout, result.exit_code) == ("ok", "hello\n", 0)


def test_large_stdin_is_delivered_whole():
    data = "x" * (1 << 20)
    result = _sandbox().run("import sys\nprint(len(sys.stdin.read()))", stdin=data)
    assert result.stdout == f"{1 << 20}\n"


def test_extra_files_are_in_the_working_directory():
    result = _sandbox().run("print(open('data/in.txt').read())", files={"data/in.txt": "42"})
    assert result.stdout == "42\n"


def test_nonzero_exit_is_an_error_with_its_code():
    result = _sandbox().run("import sys\nsys.exit(3)")
    assert (result.status, result.exit_code, result.limit_fired) == ("error", 3, None)


def test_uncaught_exception_is_an_error_with_the_traceback():
    result = _sandbox().run("raise ValueError('bad input')")
    assert result.status == "error"
    assert result.stderr.rstrip().endswith("ValueError: bad input")


def test_self_inflicted_signal_is_reported_as_killed():
    result = _sandbox().run("import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)")
    assert (result.status, result.signal) == ("killed", signal.SIGSEGV)


def test_files_outside_the_work_directory_are_rejected():
    with pytest.raises(ValueError, match="files"):
        _sandbox().run("pass", files={"../escape.py": "x"})


def test_check_passes_where_the_isolation_works():
    _sandbox().check()


def test_no_staging_directory_is_left_behind(tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)
    _sandbox().run("open('x', 'w').write('y')")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "field,value",
    [
        ("cpu_s", 0),
        ("wall_s", -1.0),
        ("memory_mb", 8),
        ("max_processes", 0),
        ("max_output_bytes", 10),
        ("readonly_paths", ("relative/path",)),
        ("env", {"BAD NAME": "x"}),
        ("unknown_field", 1),
    ],
)
def test_out_of_bounds_config_is_rejected_naming_the_field(field, value):
    with pytest.raises(ValidationError, match=field):
        SandboxConfig(**{field: value})


def test_root_isolation_without_root_names_the_fix(monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(SandboxUnavailable, match='isolation="unprivileged"'):
        ProcessSandbox(SandboxConfig(isolation="namespaces"))


@pytest.mark.parametrize(
    "stderr,expected",
    [
        ("Traceback...\nMemoryError\n", ("memory", "memory_mb")),
        ("numpy.core._exceptions._ArrayMemoryError: Unable to allocate", ("memory", "memory_mb")),
        ("BlockingIOError: [Errno 11] Resource temporarily unavailable", ("process_limit", "max_processes")),
        ("RuntimeError: can't start new thread", ("process_limit", "max_processes")),
        ("OSError: [Errno 27] File too large", ("file_limit", "max_file_mb")),
        ("ValueError: nope", ("error", None)),
    ],
)
def test_failed_calls_are_attributed_to_their_limit(stderr, expected):
    assert _limit_from_stderr(stderr) == expected


def test_in_memory_sandbox_answers_from_its_function():
    fake = InMemorySandbox(lambda code, stdin: SandboxResult(status="ok", exit_code=0, stdout=code + stdin.decode()))
    assert fake.run("a", stdin="b").stdout == "ab"


def test_concurrent_runs_from_threads_each_get_their_own_output():
    from concurrent.futures import ThreadPoolExecutor

    sandbox = _sandbox()
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda i: sandbox.run("print(input())", stdin=f"{i}\n"), range(4)))
    assert [r.stdout for r in results] == ["0\n", "1\n", "2\n", "3\n"]


def test_concurrent_runs_never_share_a_uid():
    sandbox = _sandbox(uid_base=1_800_000, uid_slots=2)
    with sandbox._reserve_uid() as first, sandbox._reserve_uid() as second:
        assert {first, second} == {1_800_000, 1_800_001}
        with pytest.raises(SandboxUnavailable, match="uid_slots"):
            with sandbox._reserve_uid():
                pass
