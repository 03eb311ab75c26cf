#!/usr/bin/env python3
"""Convert a local DAPO-Math-17k file (verl-format parquet or jsonl) into deduplicated jsonl.

    python scripts/prep_dapo_math.py dapo-math-17k.parquet --out-dir data/dapo-math --heldout 500

writes data/dapo-math/train.jsonl and data/dapo-math/heldout.jsonl (verl format, one problem per
line) and prints the counts as JSON. Train on it with `task.name: dataset`,
`task.path: data/dapo-math/train.jsonl`, `task.test_path: data/dapo-math/heldout.jsonl` (or an
AIME file). No download happens here: fetch the file yourself. See docs/reward.md.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("src", type=Path, help="the DAPO-Math-17k .parquet or .jsonl file")
    p.add_argument(
        "--out-dir", type=Path, default=Path("data/dapo-math"), help="where train.jsonl and heldout.jsonl go"
    )
    p.add_argument("--heldout", type=int, default=500, help="unique problems held out for evaluation")
    p.add_argument("--seed", type=int, default=0, help="seed of the shuffle before the split")
    args = p.parse_args(argv)
    if args.heldout < 0:
        p.error("--heldout must be >= 0")

    from stare.data.tasks.dataset import DatasetError, prepare_dapo_math

    try:
        counts = prepare_dapo_math(args.src, args.out_dir, heldout=args.heldout, seed=args.seed)
    except DatasetError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    print(json.dumps(counts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
