"""`stare sim --validate`'s rows say what the peers' recipe files say (values read from them by hand: NVIDIA-NeMo/RL
v0.5.0 examples/configs/recipes/llm/performance/*.yaml and grpo_math_1B.yaml; volcengine/verl
verl/experimental/one_step_off_policy/shell/dapo_7b_math_fsdp2_{colocate,4_12}.sh), and the table marks the
held-out rows and the async/sync ratio's direction."""

from __future__ import annotations

from pathlib import Path

import pytest

from stare.app.sim.validate import ROWS, table

ROW = {r.key: r for r in ROWS}
# key: (GPUs, learner GPUs or None when colocated, settings that must be among its overrides, published s/step)
RECIPES = {
    "nemo-8b-on": (16, None, {"rollout.samples_per_prompt=32", "rollout.engine.gpu_memory_utilization=0.6"}, 92.8),
    "nemo-8b-1off": (
        16,
        8,
        {"system.max_staleness=1", "system.inflight_weight_updates=true", "rollout.engine.gpu_memory_utilization=0.8"},
        64.8,
    ),
    "nemo-32b-on": (32, None, {"rollout.engine.tensor_parallel_size=4"}, 376),
    "nemo-32b-1off": (64, 32, {"rollout.engine.tensor_parallel_size=4", "system.inflight_weight_updates=true"}, 200),
    "verl-7b-sync": (
        16,
        None,
        {
            "rollout.prompts_per_step=512",
            "rollout.samples_per_prompt=12",
            "rollout.engine.tensor_parallel_size=2",
            "rollout.max_new_tokens=8192",
        },
        749,
    ),
    "verl-7b-1off": (16, 12, {"rollout.engine.tensor_parallel_size=2", "system.max_staleness=1"}, 520),
}


@pytest.mark.parametrize("key", list(RECIPES))
def test_a_rows_split_and_settings_are_its_recipes(key):
    gpus, learner, settings, published = RECIPES[key]
    row = ROW[key]
    assert (row.gpus, row.learner_gpus, row.published_s) == (gpus, learner, published)
    assert settings <= set(row.overrides)
    assert row.source


def test_the_qwen3_32b_pair_is_held_out_and_only_it():
    assert {r.key for r in ROWS if r.held_out} == {"nemo-32b-on", "nemo-32b-1off"}


def test_the_table_marks_held_out_rows_band_and_ratio_direction():
    def fig(s):
        return {"s_per_step": s}

    results = {
        "nemo-8b-on": {"pessimistic": fig(100.0), "central": fig(90.0), "optimistic": fig(80.0)},
        "nemo-8b-1off": {"pessimistic": fig(70.0), "central": fig(66.0), "optimistic": fig(60.0)},
        "nemo-32b-on": {"central": fig(376.0)},
    }
    text = table(results)
    assert "| 92.8 | 90.0 [80.0, 100.0] | -3% | yes |" in text
    assert "1.43 / 1.36 (same direction)" in text
    assert "(held out)" in text


def test_the_sims_text_cites_public_sources_only(capsys):
    """What `stare sim` and `stare plan` print and their modules say names public sources: no issue numbers of
    this project, no private design notes."""
    import re

    from stare.app.cli.parser import build_parser
    from stare.app.sim import constants

    texts = [p.read_text() for p in Path(constants.__file__).parent.glob("*.py")]
    for args in (["sim", "--help"], ["plan", "--help"]):
        with pytest.raises(SystemExit):
            build_parser().parse_args(args)
        texts.append(capsys.readouterr().out)
    texts.append(constants.markdown_table())
    for text in texts:
        assert not re.search(r"issue #\d+|shared/|DESIGN\.md", text)
    assert all(r.source for r in constants.TABLE.values())
