"""One group of the doctor's checks, in a process of its own:

    python -m stare.app.doctor.worker MODULE CONTEXT_JSON ROWS_JSONL

MODULE: the group's module (stare.app.doctor.registry.Group.module), with `run(ctx, report)`.

Each row is appended to ROWS_JSONL (one JSON object a line, flushed) as soon as its check ends."""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

from stare.app.doctor.registry import Context, Row


def main(argv: list[str]) -> int:
    module, context, rows = argv
    path = Path(rows)

    def report(row: Row) -> None:
        with path.open("a", encoding="utf-8") as f:
            f.write(json.dumps(row.to_json()) + "\n")
            f.flush()

    importlib.import_module(module).run(Context.from_json(json.loads(context)), report)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
