"""The sections of docs/results.md for the two smaller studies: several updates per batch (the
baselines' mini-batches, docs/results/mb/) and the real model (SmolLM2-135M-Instruct,
docs/results/smollm2/); their curves are stare.app.report.studies'."""

from __future__ import annotations

from stare.app.report import horizon, studies
from stare.app.report.tables import paired, table

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


def minibatch_section(data, figure: str) -> list[str]:
    """Several updates per batch: how far the updates move off the sampling policy, the outcomes,
    and each -mb variant paired with grpo (one update per batch) and with its own one-update row."""
    several = [x for x in data if "-mb" in x]
    data = {x: data[x] for x in sorted(data, key=lambda x: ("-mb" in x, x != "grpo", x))}
    lines = [
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
    ]
    for mb in several:  # against grpo, its own one-update row, and grpo cut alike (kl-cov-mb-lr8: grpo-mb-lr8)
        control = "grpo" + mb[len(_one_update(mb)) :]
        for other in dict.fromkeys(("grpo", _one_update(mb), control)):
            if other in data and other != mb:
                lines += [*paired(data, mb, other, UPDATE_KEYS, UPDATE_SCALES), ""]
    return lines + [f"Machines (model sha256 prefix / torch CPU capability): {_machines(data)}.", ""]


SMOLLM2_COLUMNS = (
    ("entropy_last", "batch entropy, mean of the steps (nats)", 3, 1.0),
    ("greedy_first", "greedy acc. at start", 3, 1.0),
    ("greedy_last", "greedy acc. at end", 3, 1.0),
    ("pass@1", "avg@n at end", 3, 1.0),
    ("pass@4", "pass@4 at end", 3, 1.0),
    ("gate_on", "gate on %", 1, 100.0),
    ("step_s", "wall time / step (s)", 1, 1.0),
)


def smollm2_section(data, figure: str) -> list[str]:
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
        *studies.entropy_table(data, "stare", "grpo", marks),
        "",
        *horizon.curve_table(data, "stare", "grpo", "greedy"),
        "",
        *horizon.curve_table(data, "stare", "grpo", "pass@1"),
        "",
        *table(data, SMOLLM2_COLUMNS),
        "",
        *[
            line
            for label in ("stare", *sorted(set(data) - {"stare", "grpo"}))
            if label in data
            for line in (*paired(data, label, "grpo", ["entropy_last", "greedy_last", "pass@1", "pass@4"]), "")
        ],
        f"Machines (model sha256 prefix / torch CPU capability): {_machines(data)}.",
        "",
    ]
