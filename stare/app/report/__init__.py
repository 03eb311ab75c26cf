"""End-of-run report for one run and the comparison figure for several runs (summary.py: the
numbers; plots.py: one run's figures; compare.py: several runs).

A training run writes `runs/<name>/metrics.jsonl` (one object per optimizer step) and
`runs/<name>/eval.jsonl` (one object per held-out evaluation). From those files:

- `summarize(run_dir)` computes the run's headline numbers as a dict (see `SUMMARY_KEYS`);
- `write_report(run_dir)` writes `run_dir/report/`: `report.png` (all panels), one PNG per panel
  and `summary.md`;
- `compare(run_dirs)` groups runs by `algo` (seeds of the same algorithm) and computes one table
  row per algorithm;
- `write_comparison(run_dirs, out_dir)` writes `out_dir/compare.png` and `out_dir/compare.md`.

Limits: the files are read once, as they are; a run still writing is reported up to its last
complete line (a truncated last line is skipped, a malformed line elsewhere is an error). Any key
may be missing or null: the number that needs it is `None` ("n/a" in Markdown) and its curve is
left out. Smoothing (an EMA overlay) is for display only; every number in the summaries is
computed from the raw values. Figures are drawn on `matplotlib.figure.Figure` objects rendered by
Agg, so nothing touches the global pyplot backend or state of a caller.

Run from the shell: `python -m stare.app.report runs/a` (one report per run directory given) or
`python -m stare.app.report runs/a runs/b --compare out/` (the comparison).
"""

from __future__ import annotations

from pathlib import Path

from stare.app.report.compare import compare, write_comparison
from stare.app.report.plots import write_report
from stare.app.report.summary import SUMMARY_KEYS, ema, load_jsonl, summarize

__all__ = ["SUMMARY_KEYS", "compare", "ema", "load_jsonl", "main", "summarize", "write_comparison", "write_report"]


def main(argv: list[str] | None = None) -> None:
    import argparse

    p = argparse.ArgumentParser(prog="python -m stare.app.report", description=__doc__.splitlines()[0])
    p.add_argument("run_dirs", nargs="+", type=Path, help="run directories (each with metrics.jsonl)")
    p.add_argument("--compare", type=Path, metavar="OUT_DIR", help="write the comparison of all runs here instead")
    args = p.parse_args(argv)
    if args.compare is not None:
        print(write_comparison(args.run_dirs, args.compare))
    else:
        for run_dir in args.run_dirs:
            print(write_report(run_dir))
