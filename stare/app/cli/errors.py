"""What the `stare` command prints when something goes wrong: a user's mistake is one message
naming the file (and the 1-based line), what is wrong and the fix, exit code 2; a run that trained
nothing exits 3 with why; anything else is a bug and keeps its traceback.

The families (docs/troubleshooting.md lists each message, its cause and its fix):

    config       stare.config.ConfigError: a field, its bound, an unknown key, --set KEY=VALUE,
                 a model directory (stare.models.resolve.check_model_dir), a Redis URL or its secret file
    files        stare.config.files.FileInputError: YAML syntax (file, line, column), not UTF-8
    datasets     stare.data.tasks.dataset.DatasetError ("FILE line N" / "FILE row N", 1-based)
    prompts      stare.data.prompt_policy.PromptPolicyError: every prompt refused by the length policy
    checkpoints  learner.engine.checkpoints.CheckpointError: the damaged file, no complete checkpoint
    export       learner.engine.export.ExportError
    Redis        redis AuthenticationError / ConnectionError / a URL redis-py cannot parse;
                 RunStateUnavailable (the store did not answer within its retry budget)
    run folders  stare.runtime.run_lock.RunLockError (the folder's writer: pid, host, command, since),
                 RunFolderError (read-only, not writable, a full disk with the last complete checkpoint);
                 any other OSError of a full disk (ENOSPC, EDQUOT) or a read-only one (EROFS), naming the file
    outcome      learner.loop.run_outcome.NothingTrained (exit 3)

`--debug` (anywhere on the command line) or STARE_DEBUG=1 shows the traceback of a mapped error too.
"""

from __future__ import annotations

import errno
import os
import sys
from collections.abc import Callable

USER_ERROR = 2
NOTHING_TRAINED = 3


def _known() -> list[tuple[type[BaseException], int, Callable[[BaseException], str]]]:
    """(type, exit code, message) of each family; imported here, when an error is being explained."""
    import redis.exceptions as rx

    from learner.engine.checkpoints import CheckpointError
    from learner.engine.export import ExportError
    from learner.loop.run_outcome import NothingTrained
    from stare.config import ConfigError
    from stare.config.files import FileInputError
    from stare.data.prompt_policy import PromptPolicyError
    from stare.data.tasks.dataset import DatasetError
    from stare.runstate.base import RunStateUnavailable
    from stare.runtime.run_lock import RunFolderError, RunLockError

    same = str
    return [
        (ConfigError, USER_ERROR, same),
        (FileInputError, USER_ERROR, same),
        (DatasetError, USER_ERROR, same),
        (PromptPolicyError, USER_ERROR, same),
        (CheckpointError, USER_ERROR, same),
        (ExportError, USER_ERROR, same),
        (RunLockError, USER_ERROR, same),
        (RunFolderError, USER_ERROR, same),
        (NothingTrained, NOTHING_TRAINED, lambda e: f"the run trained nothing useful: {e}"),
        (
            rx.AuthenticationError,
            USER_ERROR,
            lambda e: (
                f"Redis refused the password ({e}); put the right one in the Redis URL (--redis-url-file, "
                f"STARE_REDIS_PASSWORD_FILE or system.redis_url)"
            ),
        ),
        (
            rx.AuthorizationError,
            USER_ERROR,
            lambda e: f"Redis refused the command ({e}); the Redis user needs stream, list and hash commands",
        ),
        (
            rx.ConnectionError,
            USER_ERROR,
            lambda e: f"cannot reach Redis ({e}); start redis-server or fix the URL (--redis-url, system.redis_url)",
        ),
        (RunStateUnavailable, USER_ERROR, lambda e: f"{e}; check that Redis runs and the URL is right"),
    ]


def explain(err: BaseException) -> tuple[int, str] | None:
    """(exit code, message) for a known mistake; None for an unexpected error (a bug: traceback)."""
    try:
        known = _known()
    except ImportError:  # a partial install: only what imports can be explained
        return None
    for kind, code, message in known:
        if isinstance(err, kind):
            return code, message(err)
    if isinstance(err, ValueError) and "Redis URL must specify" in str(err):  # redis-py's from_url
        return USER_ERROR, f"invalid Redis URL: {err}"
    if isinstance(err, OSError) and err.errno in (errno.ENOSPC, errno.EDQUOT):
        return USER_ERROR, f"disk full writing {err.filename or 'a file'}: free space on that disk, then run again"
    if isinstance(err, OSError) and err.errno == errno.EROFS:
        return USER_ERROR, f"{err.filename or 'a file'}: read-only file system; write to a writable folder"
    return None


def debug_requested(argv: list[str]) -> tuple[bool, list[str]]:
    """(--debug given or STARE_DEBUG=1, argv without --debug)."""
    rest = [a for a in argv if a != "--debug"]
    return len(rest) != len(argv) or os.environ.get("STARE_DEBUG", "") not in ("", "0"), rest


def run_reporting(fn: Callable[[], int], debug: bool) -> int:
    """fn(), with a known mistake printed as one message (`stare: ...`) and its exit code; a Ctrl-C that no
    command handles (during its imports) is one line and 130, as a shell reports it."""
    try:
        return fn()
    except KeyboardInterrupt:
        if debug:
            raise
        print("stare: interrupted", file=sys.stderr, flush=True)
        return 130
    except Exception as err:
        explained = explain(err)
        if explained is None or debug:
            raise
        code, message = explained
        print(f"stare: {message}", file=sys.stderr, flush=True)
        if code == USER_ERROR:
            print("stare: (--debug or STARE_DEBUG=1 shows where it was raised)", file=sys.stderr, flush=True)
        return code
