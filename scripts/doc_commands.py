#!/usr/bin/env python3
"""Print the shell commands a section of a Markdown page tells the reader to run.

    scripts/doc_commands.py docs/deploy.md "The CPU profile"

prints, one per line, the commands of the ```bash blocks under that heading (up to the next heading
of the same or a higher level): comments and blank lines dropped, lines ending in a backslash
joined. scripts/compose_e2e.sh runs the compose guide's commands from this output, so the page is
what the end-to-end run does (tests/deploy/test_compose_guide.py checks the e2e covers every line).
Standard library only: it runs where only Docker and python3 are installed. Exit 2 when the page
or the heading does not exist, or the section holds no command.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*$")


def strip_comment(line: str) -> str:
    """`line` without a trailing shell comment (a # after whitespace, outside quotes)."""
    quote = None
    for i, ch in enumerate(line):
        if quote:
            if ch == quote:
                quote = None
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i].rstrip()
    return line.rstrip()


def section_commands(text: str, heading: str) -> list[str]:
    """The commands of the bash blocks in the section titled `heading` (KeyError: no such heading)."""
    lines = text.splitlines()
    start = level = None
    for i, line in enumerate(lines):
        m = _HEADING.match(line)
        if m and m.group(2) == heading:
            start, level = i + 1, len(m.group(1))
            break
    if start is None:
        raise KeyError(heading)
    commands: list[str] = []
    in_block, pending = False, ""
    for line in lines[start:]:
        fence = line.strip()
        if fence.startswith("```"):
            in_block = not in_block and fence in ("```bash", "```sh", "```shell")
            continue
        if not in_block:
            m = _HEADING.match(line)
            if m and len(m.group(1)) <= level:
                break
            continue
        command = strip_comment(line)
        if command.endswith("\\"):
            pending += command[:-1].rstrip() + " "
            continue
        command = (pending + command.strip()).strip()
        pending = ""
        if command:
            commands.append(command)
    return commands


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: doc_commands.py PAGE.md 'Heading'", file=sys.stderr)
        return 2
    page, heading = Path(argv[0]), argv[1]
    try:
        commands = section_commands(page.read_text(encoding="utf-8"), heading)
    except OSError as err:
        print(f"doc_commands: cannot read {page}: {err.strerror}", file=sys.stderr)
        return 2
    except KeyError:
        print(f"doc_commands: {page} has no heading {heading!r}", file=sys.stderr)
        return 2
    if not commands:
        print(f"doc_commands: {page}, {heading!r}: no ```bash block with a command", file=sys.stderr)
        return 2
    print("\n".join(commands))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
