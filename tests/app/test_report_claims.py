"""Families, verdicts and the claims section of docs/results.md (stare.app.report.claims, headline,
tables.same_algorithm), with the p-values derived by hand in the comments."""

import pytest

from stare.app.report.claims import compare, family, of_diffs, pair_tables, seeds_sentence
from stare.app.report.headline import CLAIMS, claims_section
from stare.app.report.stats import holm
from stare.app.report.tables import same_algorithm, same_algorithm_note


def _one(diffs, others=0):
    """The first comparison of a family: `diffs` beside `others` comparisons of no difference."""
    rows = [of_diffs("a", "b", "k", dict(enumerate(diffs)))]
    rows += [of_diffs("a", "b", f"z{i}", {0: 1.0, 1: -1.0, 2: 0.5, 3: -0.5}) for i in range(others)]
    return family(rows)[0]


def test_verdicts_follow_the_first_rule_met():
    # 10 seeds of one sign: sign-flip p 2/1024, alone in its family -> holds without a normality assumption
    assert _one([0.1 + 0.01 * i for i in range(10)]).verdict == "holds"
    # 5 seeds of one sign: sign-flip p >= 2/32 = 0.0625 whatever the size; t p tiny -> only the t-test
    assert _one([1.0, 1.1, 0.9, 1.05, 0.95]).verdict == "holds (t-test)"
    # 1..5: t p = 1 - 36/(11 sqrt(11)) = 0.0132 < 0.05, x 5 comparisons = 0.066 after Holm -> suggestive
    c = _one([1.0, 2.0, 3.0, 4.0, 5.0], others=4)
    assert c.holm_t == pytest.approx(5 * c.stats.p_t) and c.verdict == "suggestive"
    assert _one([1.0, -1.0, 2.0, -2.0, 0.5]).verdict == "not resolved"
    assert _one([0.3]).verdict == "one seed: not resolved"
    assert of_diffs("a", "b", "k", {}).verdict == "no pair yet"


def test_a_family_adjusts_both_tests_over_its_comparisons_with_holm():
    rows = family([of_diffs("a", "b", k, dict(enumerate(d))) for k, d in
                   (("x", [1.0, 2.0, 3.0]), ("y", [1.0, 2.0, -0.5]), ("z", [0.2]))])  # fmt: skip
    # z has one seed: a sign-flip p (1.0) but no t-test, so the t family has 2 members, the sign-flip family 3
    assert [r.holm_t for r in rows] == pytest.approx([*holm([rows[0].stats.p_t, rows[1].stats.p_t]), None])
    # sign-flip: x 2/8 (all positive); y: |+-1 +-2 +-0.5| >= 2.5 for 2.5, 3.5 and their negatives, 4/8; z 1
    assert [r.stats.p_sign for r in rows] == [0.25, 0.5, 1.0]
    assert [r.holm_sign for r in rows] == [0.75, 1.0, 1.0]  # 3 x 0.25; 2 x 0.5; 1


def test_pairs_leave_out_seeds_from_two_machines_and_say_so():
    rec = lambda v, m="m/AVX2": {"machine": m, "pass@1": v}  # noqa: E731
    data = {
        "stare": {0: rec(0.5), 1: rec(0.9, "other/AVX512"), 2: rec(0.4)},
        "grpo": {0: rec(0.3), 1: rec(0.1), 2: rec(0.1)},
    }
    c = compare(data, "stare", "grpo", "pass@1")
    assert (c.seeds, c.left_out) == ((0, 2), (1,))
    assert c.stats.mean == pytest.approx((0.2 + 0.3) / 2)
    assert pair_tables([c])[0].startswith("| stare - grpo (2 seeds; seeds 1 left out: run on different machines) |")


def test_the_seeds_sentence_says_what_the_number_of_seeds_can_show():
    five = family([of_diffs("a", "b", f"k{i}", dict(enumerate([0.1, 0.2, 0.3, 0.4, 0.5]))) for i in range(10)])
    text = seeds_sentence(five)
    assert "5 seeds per pair" in text and "cannot go below p = 2/2^5 = 0.0625" in text
    assert "Holm-adjusted sign-flip p of 0.6250" in text  # 10 x 0.0625
    assert "nothing here can hold without the t-test's assumption" in text and "covers about 85%" in text
    ten = family([of_diffs("a", "b", f"k{i}", dict(enumerate([0.1] * 10))) for i in range(4)])
    assert "over the 4 comparisons is 0.0078" in seeds_sentence(ten)  # 4 x 2/1024
    assert "no spread to estimate" in seeds_sentence([of_diffs("a", "b", "k", {0: 0.1})])


def test_labels_whose_records_agree_but_for_wall_time_are_one_algorithm():
    rec = lambda label, v, t: {"name": f"s0-{label}", "label": label, "pass@1": v, "step_s": t, "load": t}  # noqa: E731
    data = {"grpo": {0: rec("grpo", 0.5, 1.0)}, "kl-cov": {0: rec("kl-cov", 0.5, 2.0)}}
    assert same_algorithm(data) == {"kl-cov": "grpo"}
    assert "Of the 2 algorithms above (grpo, kl-cov), 1 are distinct" in same_algorithm_note(data, ("grpo", "kl-cov"))
    data["kl-cov"][0]["pass@1"] = 0.51  # one number apart: two algorithms
    assert same_algorithm(data) == {} and same_algorithm_note(data, ("grpo", "kl-cov")) == ""


def test_every_claim_has_a_row_and_a_study_without_records_says_so():
    lines = claims_section({})
    rows = [line for line in lines if line.startswith("| C")]
    assert len(rows) == len(CLAIMS)
    assert (
        rows[0]
        == "| C1 | 300 steps (Paired differences) | stare - grpo | entropy_last | 0 | no records |  |  |  | no pair yet |"
    )


def test_every_sweep_label_of_results_sh_is_a_valid_config():
    """scripts/results.sh's labels (`scripts/results.sh list`: name|algo|overrides) load as run configs:
    the paper's STARE settings of the longer horizon (stare-paper) included."""
    import os
    import subprocess
    from pathlib import Path

    from stare.config import load_config

    repo = Path(__file__).parents[2]
    env = {**os.environ, "SEEDS": "0", "JOBLIST": ""}
    out = subprocess.run(["bash", "scripts/results.sh", "list"], cwd=repo, env=env, capture_output=True, text=True,
                         timeout=30, check=True).stdout  # fmt: skip
    lines = [line.split("|") for line in out.splitlines()]
    assert "s0-stare-paper" in [name for name, _, _ in lines]
    for name, algo, extra in lines:
        cfg = load_config(repo / "configs" / "tiny-cpu.yaml", algo=algo, overrides=extra.split())
        if name == "s0-stare-paper":  # the paper's short-CoT recipe: O1, P 0.1, W 1.1 fixed, target 0.3, no band
            assert (cfg.loss.variant, cfg.loss.top_fraction, cfg.controller.w) == ("O1", 0.1, 1.1)
            assert (cfg.controller.adaptive, cfg.controller.target, cfg.controller.band) == (False, 0.3, None)
