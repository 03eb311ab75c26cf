from pathlib import Path

import pytest
import yaml

from stare.config import ALGO_PRESETS, ConfigError, build_config, load_config

CONFIG_DIR = Path(__file__).parents[2] / "configs"
CONFIGS = sorted(CONFIG_DIR.glob("**/*.yaml"))
# the paper settings with their GRPO-ds baselines (docs/recipes.md)
PAPER = sorted(
    p for p in (CONFIG_DIR / "paper").glob("*.yaml") if p.name.startswith(("short-cot-", "long-cot-", "tool-use-"))
)


@pytest.mark.parametrize("path", CONFIGS, ids=[p.relative_to(CONFIG_DIR).as_posix() for p in CONFIGS])
def test_every_shipped_config_parses(path):
    cfg = load_config(path)
    assert cfg.run.steps >= 1


@pytest.mark.parametrize("path", PAPER, ids=[p.name for p in PAPER])
def test_paper_configs_name_their_source_and_the_reference_settings(path):
    text = path.read_text()
    assert "hp-luo/STARE recipe/STARE/" in text and "[ref]" in text
    cfg = load_config(path)
    assert (cfg.rollout.prompts_per_step, cfg.rollout.samples_per_prompt, cfg.optim.lr) == (64, 8, 1e-6)
    assert (cfg.loss.eps_low, cfg.loss.eps_high, cfg.loss.dual_clip_c, cfg.loss.agg_mode) == (
        0.2,
        0.28,
        10.0,
        "token-mean",
    )
    assert (cfg.data.max_prompt_len, cfg.data.prompt_overflow, cfg.data.max_sampling_rounds) == (
        1024,
        "truncate_left",
        10,
    )
    assert cfg.system.max_staleness == 0 and cfg.data.dynamic_sampling
    assert {s: (e.n, e.top_p) for s, e in cfg.task.eval_sources.items()} == {"aime24": (32, 0.7), "aime25": (32, 0.7)}


def test_paper_grpo_ds_baseline_is_the_stare_config_with_the_preset():
    stare = load_config(CONFIG_DIR / "paper" / "short-cot-qwen2.5-math-7b-stare.yaml", algo="grpo-ds")
    baseline = load_config(CONFIG_DIR / "paper" / "short-cot-qwen2.5-math-7b-grpo-ds.yaml")
    assert stare.model_dump() == baseline.model_dump()


def test_default_config_is_shipped_and_is_stare():
    from stare.app.cli import default_config_path

    cfg = load_config(default_config_path())
    assert cfg.loss.name == "stare" and cfg.algo == "stare"


@pytest.mark.parametrize(
    "override, field",
    [
        ("optim.lr=-1", "optim.lr"),
        ("loss.top_fraction=1.5", "loss.top_fraction"),
        ("rollout.samples_per_prompt=1", "rollout.samples_per_prompt"),
        ("controller.band=[0.5, 0.1]", "band"),
        ("rollout.engine=tgi", "rollout.engine"),
        ("run.stepz=3", "run.stepz"),
    ],
)
def test_bad_value_names_the_field(override, field):
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        build_config({}, overrides=[override])


def test_override_values_are_parsed_as_yaml():
    cfg = build_config({}, overrides=["controller.band=[0.2, 0.4]", "data.dynamic_sampling=false", "optim.lr=3e-4"])
    assert cfg.controller.band == (0.2, 0.4) and cfg.data.dynamic_sampling is False and cfg.optim.lr == 3e-4


@pytest.mark.parametrize("algo", sorted(ALGO_PRESETS))
def test_every_algo_preset_builds(algo):
    cfg = build_config({"run": {"name": "x"}}, algo=algo)
    assert cfg.algo == algo
    assert cfg.loss.name == ALGO_PRESETS[algo]["loss"]["name"]


def test_switching_algo_keeps_the_shared_surrogate_settings():
    cfg = build_config({"loss": {"name": "stare", "eps_low": 0.1, "top_fraction": 0.3}}, algo="clip-cov")
    assert cfg.loss.name == "clip-cov" and cfg.loss.eps_low == 0.1


def test_grpo_matched_keeps_the_clip_range_and_turns_dynamic_sampling_off():
    raw = {"loss": {"name": "stare", "eps_high": 0.25}, "data": {"dynamic_sampling": True}}
    cfg = build_config(raw, algo="grpo-matched")
    assert (cfg.loss.name, cfg.loss.eps_high, cfg.data.dynamic_sampling) == ("grpo", 0.25, False)


def test_grpo_is_vanilla_grpo_whatever_the_config_clips():
    cfg = build_config({"loss": {"name": "stare", "eps_low": 0.1, "eps_high": 0.28}}, algo="grpo")
    assert (cfg.loss.name, cfg.loss.eps_low, cfg.loss.eps_high, cfg.data.dynamic_sampling) == ("grpo", 0.2, 0.2, False)


# The presets as they were before `grpo` became vanilla and `dapo` gained the overlong punishment (818deb8):
# the recorded studies ran these, under the names that now keep them.
OLD_GRPO = {"loss": {"name": "grpo"}, "data": {"dynamic_sampling": False}}
OLD_DAPO = {
    "loss": {"name": "grpo", "eps_low": 0.2, "eps_high": 0.28, "agg_mode": "token-mean"},
    "data": {"dynamic_sampling": True},
}


def test_the_old_presets_live_on_under_their_new_names():
    assert ALGO_PRESETS["grpo-matched"] == OLD_GRPO and ALGO_PRESETS["dapo-no-overlong"] == OLD_DAPO


def test_the_recorded_studies_run_the_presets_they_were_recorded_with():
    """scripts/results.sh keeps its labels (the records' names) and runs the old presets under them."""
    script = (CONFIG_DIR.parent / "scripts" / "results.sh").read_text()
    rows = [line.strip().strip('"').split("|") for line in script.splitlines() if line.strip().startswith('"')]
    rows = {row[1]: row[2] for row in rows if len(row) == 4}  # tier|label|algo|overrides
    for label in ("grpo", "grpo-mb", "grpo-mb-lr8"):
        assert rows[label] == "grpo-matched", label
    for label in ("dapo", "dapo-mb"):
        assert rows[label] == "dapo-no-overlong", label


def test_dapo_adds_the_soft_overlong_punishment_to_the_task_verifier():
    cfg = build_config({}, algo="dapo", overrides=["rollout.max_new_tokens=40"])  # read after the overrides
    task, overlong = cfg.reward.components
    assert task.kind == "task" and overlong.kind == "overlong"
    # DAPO's ratio L_cache / L_max = 4,096 / 20,480 = 0.2: 8 of 40 tokens, L_max the response limit
    assert (overlong.config.max_length, overlong.config.cache_length, overlong.config.penalty_factor) == (40, 8, 1.0)
    assert (cfg.loss.eps_low, cfg.loss.eps_high, cfg.loss.agg_mode, cfg.data.dynamic_sampling) == (
        0.2, 0.28, "token-mean", True)  # fmt: skip


def test_dapo_adds_the_punishment_to_a_configured_reward_and_keeps_an_existing_one():
    math_only = {"reward": {"components": [{"kind": "math"}]}, "rollout": {"max_new_tokens": 100}}
    cfg = build_config(math_only, algo="dapo")
    assert [c.kind for c in cfg.reward.components] == ["math", "overlong"]
    assert cfg.reward.components[1].config.cache_length == 20
    own = {"components": [{"kind": "math"}, {"kind": "overlong", "config": {"max_length": 100, "cache_length": 50}}]}
    cfg = build_config({"reward": own, "rollout": {"max_new_tokens": 100}}, algo="dapo")
    assert [c.config.cache_length for c in cfg.reward.components if c.kind == "overlong"] == [50]


def test_unknown_algo_lists_the_valid_ones():
    with pytest.raises(ConfigError, match="grpo"):
        build_config({}, algo="ppo")


def test_missing_config_file_is_a_clear_error(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "nope.yaml")


def test_config_round_trips_through_yaml():
    cfg = build_config({}, algo="kl-cov", overrides=["controller.band=[0.2, 0.4]"])
    again = build_config(yaml.safe_load(yaml.safe_dump(cfg.model_dump(mode="json"))))
    assert again == cfg


def test_a_run_folder_is_locked_to_one_process(tmp_path):
    from stare.app.launch.run_folder import run_lock
    from stare.runtime.run_lock import RunLockError

    with run_lock(tmp_path / "run"):
        with pytest.raises(RunLockError, match="in use"):
            with run_lock(tmp_path / "run"):
                pass
    with run_lock(tmp_path / "run"):  # released on exit
        pass


def test_docs_config_reference_is_current():
    from stare.config.docs import render

    committed = (Path(__file__).parents[2] / "docs" / "config.md").read_text()
    assert committed.strip() == render().strip(), "regenerate: python -m stare.config.docs > docs/config.md"


def test_an_engine_section_without_a_name_is_the_default_engines():
    cfg = build_config({}, overrides=["rollout.engine.max_batch_size=64"])
    assert (cfg.rollout.engine.name, cfg.rollout.engine.max_batch_size) == ("hf", 64)
    vllm = build_config({"rollout": {"engine": "vllm"}}, overrides=["rollout.engine.max_num_seqs=8"])
    assert (vllm.rollout.engine.name, vllm.rollout.engine.max_num_seqs) == ("vllm", 8)


@pytest.mark.parametrize(
    "system, field",
    [
        ({"inflight_weight_updates": True, "max_staleness": 0}, "max_staleness"),
        ({"inflight_weight_updates": True, "max_staleness": 1, "rollout_streaming": False}, "rollout_streaming"),
    ],
)
def test_in_flight_weight_updates_need_staleness_and_the_streaming_loop(system, field):
    with pytest.raises(ConfigError, match=field):
        build_config({"system": system})


def test_in_flight_weight_updates_turn_the_streaming_loop_on_for_the_hf_engine():
    from rollout.engines.hf_engine import HFEngine
    from rollout.streaming import streaming_enabled

    cfg = build_config({"system": {"inflight_weight_updates": True, "max_staleness": 1}})
    engine = HFEngine.__new__(HFEngine)  # the attributes the check reads; no model
    engine.inflight_updates, engine.weight_version = True, 0
    assert cfg.rollout.engine.name == "hf" and cfg.system.rollout_streaming is None
    assert streaming_enabled(cfg, engine)


def test_the_old_control_section_is_read_as_control_plane_with_a_warning():
    with pytest.warns(FutureWarning, match="`control` is now `control_plane`"):
        cfg = build_config({"control": {"port": 9123}}, overrides=["control.host=0.0.0.0"])
    assert (cfg.control_plane.port, cfg.control_plane.host) == (9123, "0.0.0.0")


def test_the_old_and_the_new_control_plane_section_together_are_refused():
    with pytest.raises(ConfigError, match="keep control_plane only"):
        build_config({"control": {"port": 1}, "control_plane": {"port": 2}})
