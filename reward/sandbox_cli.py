"""`stare sandbox run FILE.py`: run one Python file in the sandbox and print the verdict as JSON.

The JSON has status, exit_code, signal, limit_fired, wall_s, cpu_s, output_truncated, detail and
excerpts of stdout/stderr (head and tail, `--excerpt-chars` in all). Exit code: 0 when the program
ran and exited 0, 1 for any other verdict of the program, 2 for bad arguments, 3 when the sandbox
itself is unavailable or failed. Heavy imports wait until the arguments are parsed.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="stare sandbox", description="Run untrusted Python under limits.")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run FILE.py in the sandbox and print the verdict as JSON")
    run.add_argument("file", type=Path, help="the Python program to run")
    run.add_argument("--cpu-s", type=int, default=2, help="CPU seconds per process (default 2)")
    run.add_argument("--wall-s", type=float, default=5.0, help="wall seconds (default 5)")
    run.add_argument("--memory-mb", type=int, default=512, help="address space per process, MiB (default 512)")
    run.add_argument("--max-processes", type=int, default=16, help="processes + threads at once (default 16)")
    run.add_argument(
        "--max-output-bytes",
        type=int,
        default=1 << 20,
        help="stdout + stderr bytes kept before the run is stopped (default 1 MiB)",
    )
    run.add_argument(
        "--isolation",
        choices=["namespaces", "process", "unprivileged"],
        default="namespaces",
        help="see docs/reward.md (default namespaces)",
    )
    run.add_argument("--allow-network", action="store_true", help="keep the host network")
    run.add_argument("--stdin", type=Path, default=None, help="file fed to the program's stdin")
    run.add_argument(
        "--excerpt-chars", type=int, default=2000, help="characters of stdout and of stderr to print (default 2000)"
    )
    return parser


def excerpt(text: str, limit: int) -> str:
    """`text` if it fits in `limit` characters, else its head and tail around a cut marker."""
    if len(text) <= limit:
        return text
    half = max(limit // 2, 1)
    return f"{text[:half]}\n...[{len(text) - 2 * half} characters cut]...\n{text[-half:]}"


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        code = args.file.read_text()
        stdin = args.stdin.read_bytes() if args.stdin is not None else b""
    except OSError as exc:
        print(f"stare sandbox: cannot read {exc.filename}: {exc.strerror}", file=sys.stderr)
        return 2

    from pydantic import ValidationError

    from stare.sandbox import ProcessSandbox, SandboxConfig, SandboxUnavailable

    try:
        config = SandboxConfig(
            isolation=args.isolation,
            cpu_s=args.cpu_s,
            wall_s=args.wall_s,
            memory_mb=args.memory_mb,
            max_processes=args.max_processes,
            max_output_bytes=args.max_output_bytes,
            allow_network=args.allow_network,
        )
    except ValidationError as exc:
        print(f"stare sandbox: invalid limits:\n{exc}", file=sys.stderr)
        return 2
    try:
        result = ProcessSandbox(config).run(code, stdin=stdin)
    except SandboxUnavailable as exc:
        print(f"stare sandbox: {exc}", file=sys.stderr)
        return 3
    verdict = result.model_dump(exclude={"stdout", "stderr"})
    verdict["stdout"] = excerpt(result.stdout, args.excerpt_chars)
    verdict["stderr"] = excerpt(result.stderr, args.excerpt_chars)
    print(json.dumps(verdict, indent=2))
    if result.status == "sandbox_error":
        return 3
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
