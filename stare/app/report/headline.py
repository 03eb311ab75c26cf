"""The claims section of docs/results.md: every difference the README and the notes lean on, one row
each, with its study's seeds, interval, p-values and verdict (stare.app.report.claims), so that the
README cites a numbered claim here instead of copying numbers that go stale as a sweep adds seeds.

Each claim's statistics are those of its study's section (the same Holm family); the claim's number
(C1, C2, ...) is fixed by its place in `CLAIMS`, whatever the records hold.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from stare.app.report.claims import VERDICTS, Comparison, find, interval_text, p_text, power_text

STUDIES = {  # family name -> the section it belongs to
    "tiny": "300 steps (Paired differences)",
    "long": "1,500 steps (Longer horizon)",
    "coverage": "1,500 steps, end against start",
    "first": "1,500 steps, first protocol (history)",
    "first-coverage": "1,500 steps, first protocol, end against start",
    "mb": "several updates per batch",
    "smollm2": "SmolLM2-135M-Instruct",
}
CLAIMS: tuple[tuple[str, str, str, str], ...] = (  # family, a, b, key
    ("tiny", "stare", "grpo", "entropy_last"),
    ("tiny", "stare", "grpo", "pass@1"),
    ("tiny", "stare", "grpo", "pass@8"),
    ("tiny", "stare", "grpo", "pass@64"),
    ("long", "stare", "grpo", "entropy_last"),
    ("long", "stare", "grpo", "greedy_last"),
    ("long", "stare", "grpo", "pass@1"),
    ("long", "stare", "grpo", "pass@64"),
    ("long", "stare", "dapo", "entropy_last"),
    ("long", "stare", "dapo", "pass@1"),
    ("long", "stare", "dapo", "pass@64"),
    ("long", "stare-paper", "grpo", "entropy_last"),
    ("long", "stare-paper", "grpo", "pass@64"),
    ("long", "stare-paper", "stare", "entropy_last"),
    ("long", "stare-paper", "stare", "pass@1"),
    ("long", "stare-paper", "stare", "pass@64"),
    ("coverage", "stare", "its start", "pass@64"),
    ("coverage", "grpo", "its start", "pass@64"),
    ("coverage", "dapo", "its start", "pass@64"),
    ("coverage", "stare-paper", "its start", "pass@64"),
    ("first", "stare", "grpo", "entropy_last"),
    ("first", "stare", "grpo", "greedy_last"),
    ("first", "stare", "grpo", "pass@1"),
    ("first", "stare", "grpo", "pass@64"),
    ("mb", "kl-cov-mb", "grpo", "pass@1"),
    ("mb", "clip-cov-mb", "grpo", "pass@1"),
    ("mb", "dapo-mb", "grpo", "pass@1"),
    ("smollm2", "stare", "grpo", "entropy_last"),
    ("smollm2", "stare", "grpo", "greedy_last"),
    ("smollm2", "stare-adaptive", "grpo", "entropy_last"),
    ("first-coverage", "stare", "its start", "pass@64"),
    ("first-coverage", "grpo", "its start", "pass@64"),
)


def _p_pair(p: float | None, adjusted: float | None) -> str:
    return f"{p_text(p)} / {p_text(adjusted)}"


def claims_section(families: Mapping[str, Sequence[Comparison]]) -> list[str]:
    """The numbered claims, each from its study's family (a study without records gives `no records`)."""
    lines = [
        "## Claims and their strength",
        "",
        "Every difference the README and the notes lean on, paired by seed on one machine fingerprint: the mean "
        "and its 95% Student t-interval, the two-sided paired t-test's and the exact sign-flip test's p-values, "
        "each before and after Holm's adjustment over its study's family (the comparisons of that section), and "
        "the verdict. Verdicts, the first rule met: "
        + "; ".join(f"**{word}**: {rule}" for word, rule in VERDICTS)
        + ". Seeds for 80% power: how many seeds a two-sided paired t-test at alpha 0.05 needs to detect the "
        "observed mean difference against the observed seed-to-seed spread (noncentral t); a planning figure, "
        "optimistic for a difference that was picked because it looked large, and a Holm family needs more.",
        "",
        "| claim | study | a - b | number | seeds | mean [95% t-interval] | p, sign-flip / Holm | p, t-test / Holm "
        "| seeds for 80% power | verdict |",
        "|---" * 10 + "|",
    ]
    for i, (name, a, b, key) in enumerate(CLAIMS, start=1):
        c = find(families.get(name, ()), a, b, key)
        if c is None or c.stats is None:
            lines.append(f"| C{i} | {STUDIES[name]} | {a} - {b} | {key} | 0 | no records |  |  |  | no pair yet |")
            continue
        s = c.stats
        lines.append(
            f"| C{i} | {STUDIES[name]} | {a} - {b} | {key} | {s.n} | {interval_text(c)} | "
            f"{_p_pair(s.p_sign, c.holm_sign)} | {_p_pair(s.p_t, c.holm_t)} | {power_text(c)} | {c.verdict} |"
        )
    return [*lines, ""]
