"""A run whose every prompt is refused ends as a failure naming the rule and the setting, not as a
success with zero steps (the issue's 640 dead letters, then "solved or unsolvable", exit 0)."""

import pytest

from stare.app.launch.embedded import EmbeddedRun, StopFlag
from stare.app.launch.run_folder import prepare_run
from stare.config import build_config

pytestmark = pytest.mark.slow


def test_all_prompts_refused_by_the_worker_ends_no_input_after_one_step_of_rounds(fast_overrides):
    cfg = prepare_run(build_config({}, overrides=fast_overrides + ["run.name=refused"]), None)
    run = EmbeddedRun(cfg, resume=False, log=lambda *_: None)
    run.rollout.prompt_overflow, run.rollout.prompt_limit = "reject", 2  # every prompt is longer than 2 tokens
    run.session.seams.evaluator = None  # the held-out prompts go through the same limit: keep them out of it
    try:
        outcome = run.train(StopFlag())
    finally:
        run.close()
    assert outcome.outcome == "no_input" and outcome.failed and outcome.trained_steps == 0
    # 2 prompts a round, data.max_sampling_rounds=2: 4 groups refused, then the run stops
    assert (
        "all 4 groups of the last 1 step(s) were dead-lettered (4 entries refused; 4 by: prompt has" in outcome.message
    )
    assert "admit it with data.prompt_overflow=truncate_left" in outcome.message
    assert not list((cfg.run_dir / "checkpoints").glob("step_*"))  # nothing trained, nothing saved
