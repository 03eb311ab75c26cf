"""The sections of docs/results.md for the two smaller studies: several updates per batch (the
baselines' mini-batches, docs/results/mb/) and the real model (SmolLM2-135M-Instruct,
docs/results/smollm2/); their curves are stare.app.report.studies'."""

from __future__ import annotations

from typing import Any

from stare.app.report import horizon, studies
from stare.app.report.claims import Comparison, pair_tables, pairs_family, seeds_sentence, step_cell, step_diffs
from stare.app.report.tables import table

Data = dict[str, dict[int, dict[str, Any]]]

MINI_BATCH_LABELS = ("kl-cov-mb", "clip-cov-mb", "dapo-mb", "grpo-mb")  # scripts/results.sh, tier 4-5: figure order


def _one_update(label: str) -> str:
    """The one-update algorithm of a several-updates label (`kl-cov-mb-lr8` -> `kl-cov`)."""
    return label.split("-mb")[0]


UPDATE_COLUMNS = (  # key, header, digits, scale: update_numbers()
    ("updates", "updates / batch", 1, 1.0),
    ("clip_low", "held by the clip at 1 - eps_low (% of tokens)", 2, 100.0),
    ("clip_high", "held at 1 + eps_high (%)", 2, 100.0),
    ("approx_kl", "approx-KL (x 1e-3)", 3, 1e3),
    ("approx_kl_last_update", "approx-KL, last update (x 1e-3)", 3, 1e3),
    ("ratio_std", "ratio std (x 1e-3)", 2, 1e3),
    ("cov_selected", "cov-selected tokens / step", 1, 1.0),
)
UPDATE_KEYS = ["entropy_last", "greedy_last", "pass@1", "pass@8", "pass@64", "approx_kl", "ratio_std", "clip_high"]
UPDATE_SCALES = {"approx_kl": 1e3, "ratio_std": 1e3, "clip_high": 100.0}


def _machines(data) -> str:
    return ", ".join(sorted({n["machine"] for s in data.values() for n in s.values()}))


def minibatch_family(data: Data) -> list[Comparison]:
    """Each -mb variant against grpo (one update per batch), its own one-update row and grpo cut alike
    (kl-cov-mb-lr8: grpo-mb-lr8): the section's one Holm family."""
    pairs = []
    for mb in (x for x in _ordered(data) if "-mb" in x):
        control = "grpo" + mb[len(_one_update(mb)) :]
        pairs += [
            (mb, o, UPDATE_KEYS) for o in dict.fromkeys(("grpo", _one_update(mb), control)) if o in data and o != mb
        ]
    return pairs_family(data, pairs, UPDATE_SCALES)


def _ordered(data: Data) -> list[str]:
    return sorted(data, key=lambda x: ("-mb" in x, x != "grpo", x))


def minibatch_section(data: Data, figure: str, comparisons: list[Comparison]) -> list[str]:
    """Several updates per batch: how far the updates move off the sampling policy, the outcomes,
    and each -mb variant paired with grpo (one update per batch) and with its own one-update row."""
    data = {x: data[x] for x in _ordered(data)}
    return [
        "## Several updates per batch (the baselines' mini-batches)",
        "",
        "The tiny config with `optim.mini_batches` as in each baseline's paper (the `-mb` rows, scripts/results.sh; "
        "the numbers and their sources are in the notes below), and GRPO with one update per batch, all on one "
        "machine fingerprint, runs kept in `docs/results/mb/`. Per step, over every update's loss tokens, r "
        "being the ratio to the policy that sampled the batch: the share of tokens the clip holds (A < 0 and "
        "r < 1 - eps_low; A > 0 and r > 1 + eps_high; counted alike for KL-Cov, which does not clip), "
        "approx-KL (k3: the mean of (r - 1) - log r) and the standard deviation of r; then approx-KL of each "
        "batch's last update alone, and the tokens the covariance rule selected per step; each the mean over "
        "the run's steps.",
        "",
        f"![several updates per batch]({figure})",
        "",
        *table(data, UPDATE_COLUMNS),
        "",
        *table(data),
        "",
        seeds_sentence(comparisons),
        "",
        *pair_tables(comparisons),
        "",
        f"Machines (model sha256 prefix / torch CPU capability): {_machines(data)}.",
        "",
    ]


SMOLLM2_COLUMNS = (
    ("entropy_last", "batch entropy, mean of the steps (nats)", 3, 1.0),
    ("greedy_first", "greedy acc. at start", 3, 1.0),
    ("greedy_last", "greedy acc. at end", 3, 1.0),
    ("pass@1", "avg@n at end", 3, 1.0),
    ("pass@4", "pass@4 at end", 3, 1.0),
    ("gate_on", "gate on %", 1, 100.0),
    ("step_s", "wall time / step (s)", 1, 1.0),
)


def smollm2_family(data: Data) -> list[Comparison]:
    labels = [x for x in ("stare", *sorted(set(data) - {"stare", "grpo"})) if x in data]
    return pairs_family(data, [(x, "grpo", ["entropy_last", "greedy_last", "pass@1", "pass@4"]) for x in labels])


def curve_table(data: Data, a: str, b: str, key: str) -> list[str]:
    """Per evaluation step: a, b (mean [95% bootstrap]) and a - b paired by seed (95% t, claims.step_cell)."""
    if a not in data or b not in data:
        return [f"({a} and {b} both need completed runs for the {key} curve)"]
    ra, rb = {r[0]: r for r in horizon.bands(data[a], key)}, {r[0]: r for r in horizon.bands(data[b], key)}
    diff = step_diffs(data, a, b, key)
    cell = lambda r: "n/a" if r is None else f"{r[1]:.3f} [{r[2]:.3f}, {r[3]:.3f}]"  # noqa: E731
    lines = [f"| step | {a} {key} | {b} {key} | {a} - {b}, paired (95% t) |", "|---|---|---|---|"]
    for step in sorted(set(ra) | set(rb)):
        lines.append(f"| {step} | {cell(ra.get(step))} | {cell(rb.get(step))} | {step_cell(diff.get(step, []))} |")
    return lines


def smollm2_section(data: Data, figure: str, comparisons: list[Comparison]) -> list[str]:
    """STARE against GRPO on SmolLM2-135M-Instruct: entropy per step and held-out accuracy per
    evaluation, bands over seeds, paired differences."""
    steps = max((n["steps"] for s in data.values() for n in s.values()), default=0)
    every = sorted({p["step"] for s in data.values() for n in s.values() for p in n.get("eval_curve") or []})
    marks = sorted({1, *range(5, steps + 1, 5), steps} - {0}) if steps else []
    return [
        f"## A real model: SmolLM2-135M-Instruct ({steps} steps)",
        "",
        "`configs/smollm2-cpu.yaml` (chat-arithmetic, 4 prompts x 4 samples, lr 1e-5; STARE: O1, target 0.6, "
        "W 1.1) trained longer and evaluated more often (the study's command is in scripts/results.sh's header), "
        f"held-out evaluations at steps {', '.join(map(str, every))}; runs kept in `docs/results/smollm2/`. "
        f"{steps} steps is a short horizon, and the held-out set is small (`task.eval_problems` in that command; "
        "avg@4 and pass@4 at top_p 0.7 per `eval_sources`): read the accuracy rows as a trajectory, not a "
        "verdict.",
        "",
        f"![SmolLM2]({figure})",
        "",
        seeds_sentence(comparisons),
        "",
        *studies.entropy_table(data, "stare", "grpo", marks),
        "",
        *curve_table(data, "stare", "grpo", "greedy"),
        "",
        *curve_table(data, "stare", "grpo", "pass@1"),
        "",
        *table(data, SMOLLM2_COLUMNS),
        "",
        *pair_tables(comparisons),
        "",
        f"Machines (model sha256 prefix / torch CPU capability): {_machines(data)}.",
        "",
    ]
