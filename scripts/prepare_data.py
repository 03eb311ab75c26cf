#!/usr/bin/env python3
"""Prepare the paper's training and evaluation sets in verl's parquet format from local files.

    python scripts/prepare_data.py --out-dir data \\
        --train dapo-math-17k.parquet \\
        --eval aime24=aime_2024.jsonl --eval aime25=aime2025.parquet \\
        --eval amc=aimo-validation-amc.parquet --eval math500=math500.jsonl

writes data/train.parquet (deduplicated; data_source `--train-source`, default math_dapo) and
data/<name>.parquet for each --eval NAME=FILE (data_source NAME, the key `task.eval_sources` uses),
and prints the counts as JSON. The layouts each file may have (verl rows, or question/answer
rows as the DAPO-cleaned, MATH-500, AIME and AMC sets are published) are in stare/data/prepare.py.
Nothing is downloaded: fetch the files yourself. Use them with `task.name: dataset`,
`task.path: data/train.parquet`, `task.test_path: [data/aime24.parquet, data/aime25.parquet]`.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out-dir", type=Path, default=Path("data"), help="where the parquet files go (default: data)")
    p.add_argument("--train", type=Path, default=None, help="the training file (DAPO-Math-17k, verl or cleaned layout)")
    p.add_argument("--train-source", default="math_dapo", help="data_source of question/answer training rows")
    p.add_argument(
        "--eval",
        action="append",
        default=[],
        metavar="NAME=FILE",
        help="an evaluation set: its data_source name and its file (repeatable)",
    )
    args = p.parse_args(argv)
    if args.train is None and not args.eval:
        p.error("nothing to do: pass --train FILE and/or --eval NAME=FILE")
    evals = []
    for spec in args.eval:
        name, sep, file = spec.partition("=")
        if not sep or not re.fullmatch(r"[A-Za-z0-9._-]+", name) or not file:
            p.error(
                f"--eval expects NAME=FILE with NAME of letters, digits, . _ - (e.g. aime24=aime_2024.jsonl), got {spec!r}"
            )
        evals.append((name, Path(file)))

    from stare.data.prepare import convert_file
    from stare.data.tasks.dataset import DatasetError

    counts = {}
    try:
        if args.train is not None:
            counts["train"] = convert_file(
                args.train, args.out_dir / "train.parquet", data_source=args.train_source, split="train", dedupe=True
            )
        for name, file in evals:
            counts[name] = convert_file(
                file, args.out_dir / f"{name}.parquet", data_source=name, split="test", dedupe=False
            )
    except DatasetError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    print(json.dumps(counts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
