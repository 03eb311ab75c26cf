"""`stare convert-verl`: a verl config (hydra YAML + overrides as a launch script passes them) becomes a
stare config; every mapped setting is checked against its hand-derived value and the unmapped ones are
listed with why."""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml

from stare.config.data import DataSection
from stare.config.from_verl import convert_verl, parse_value, read_verl
from stare.config.verl_table import MAPPED, NOT_NEEDED, UNMAPPED

VERL_YAML = """
defaults: [ppo_trainer, _self_]      # hydra composition: not read
data:
  train_files: /data/dapo-math-17k.parquet
  val_files: [/data/aime24.parquet, /data/aime25.parquet]
  max_prompt_length: 1024
  max_response_length: 3072
  train_batch_size: 64
  gen_batch_size: ${data.train_batch_size}     # an interpolation, overridden below
  truncation: left
actor_rollout_ref:
  model:
    path: /models/Qwen2.5-Math-7B
    use_remove_padding: true
  actor:
    ppo_mini_batch_size: 16
    ppo_micro_batch_size_per_gpu: 4
    use_dynamic_bsz: true
    ppo_max_token_len_per_gpu: ${oc.select:data.max_response_length,1}   # 3072 once resolved
    clip_ratio_low: 0.2
    clip_ratio_high: 0.28
    loss_agg_mode: token-mean
    use_kl_loss: true
    kl_loss_coef: 0.001
    kl_loss_type: low_var_kl
    entropy_coeff: 0.001
    ulysses_sequence_parallel_size: 2
    fsdp_config: {param_offload: true}
    optim: {lr: 5e-7, lr_warmup_steps_ratio: 0.1}
  rollout:
    name: vllm
    n: 8
    top_k: 20
    gpu_memory_utilization: 0.6
    val_kwargs: {n: 32, top_p: 0.7, temperature: 1.0, do_sample: true}
algorithm:
  adv_estimator: grpo
  norm_adv_by_std_in_grpo: false
  filter_groups: {enable: true, metric: acc, max_num_gen_batches: 10}
reward_model:
  reward_manager: dapo
  overlong_buffer: {enable: true, len: 512, penalty_factor: 1.0, log: false}
custom_reward_function: {path: /rewards/dapo_reward.py, name: compute_score}
trainer:
  experiment_name: "dapo qwen/7b"
  project_name: verl-dapo
  logger: [console, wandb]
  total_epochs: 2
  test_freq: 10
  save_freq: -1
  n_gpus_per_node: 8
  balance_batch: true
"""
OVERRIDES = [
    "data.gen_batch_size=192",  # 192 / 64 = 3.0 groups sampled per group trained
    "actor_rollout_ref.actor.optim.lr=1e-6",  # a float, as hydra parses it
    "+actor_rollout_ref.actor.clip_ratio_c=10.0",
    "++trainer.total_training_steps=500",
    "~actor_rollout_ref.actor.entropy_coeff",  # deleted: verl's default 0 applies, nothing set
]


@pytest.fixture
def conversion(tmp_path):
    (tmp_path / "verl.yaml").write_text(VERL_YAML)
    return convert_verl(read_verl(tmp_path / "verl.yaml", OVERRIDES))


# every stare field the conversion sets, with its value derived by hand from VERL_YAML, OVERRIDES and
# verl's defaults (weight_decay 0.01, ppo_epochs 1, grad_clip 1.0, temperature and top_p 1.0)
EXPECTED = {
    "task": {"name": "dataset", "path": "/data/dapo-math-17k.parquet",
             "test_path": ["/data/aime24.parquet", "/data/aime25.parquet"], "eval_k": 32, "eval_top_p": 0.7,
             "eval_temperature": 1.0, "eval_every": 10},
    "data": {"max_prompt_len": 1024, "prompt_overflow": "truncate_left", "oversample": 3.0, "advantage_std": False,
             "dynamic_sampling": True, "max_sampling_rounds": 10, "epochs": 2},
    "rollout": {"max_new_tokens": 3072, "prompts_per_step": 64, "samples_per_prompt": 8, "temperature": 1.0,
                "top_p": 1.0, "engine": {"name": "vllm", "gpu_memory_utilization": 0.6}},
    "model": {"path": "/models/Qwen2.5-Math-7B"},
    "optim": {"pack_sequences": True, "lr": 1e-6, "weight_decay": 0.01, "micro_batch": 4, "epochs": 1,
              "mini_batches": 4,  # a count: 64 prompts / 16 per mini-batch
              "max_tokens_per_micro_batch": 3072, "grad_clip": 1.0},
    "loss": {"name": "grpo", "eps_low": 0.2, "eps_high": 0.28, "dual_clip_c": 10.0, "agg_mode": "token-mean",
             "ref_kl": {"coef": 0.001, "estimator": "k3"}},
    "algo": "dapo",
    "reward": {"components": [
        {"kind": "function", "path": "/rewards/dapo_reward.py", "function": "compute_score"},
        {"kind": "overlong", "config": {"max_length": 3072, "cache_length": 512, "penalty_factor": 1.0}},
    ]},
    "run": {"steps": 500, "checkpoint_every": 1_000_000, "name": "dapo-qwen-7b"},
    "logging": {"wandb": {"project": "verl-dapo"}},
}  # fmt: skip
UNMAPPED_KEYS = {
    "actor_rollout_ref.actor.optim.lr_warmup_steps_ratio",  # no warmup in stare
    "actor_rollout_ref.actor.ulysses_sequence_parallel_size",
    "actor_rollout_ref.actor.fsdp_config.param_offload",
    "actor_rollout_ref.rollout.top_k",  # 20: stare samples without top-k
    "trainer.n_gpus_per_node",
}


def _nested_equal(got, want, path=""):
    if isinstance(want, dict):
        assert isinstance(got, dict) and set(got) == set(want), f"{path}: {sorted(got)} != {sorted(want)}"
        for key in want:
            _nested_equal(got[key], want[key], f"{path}.{key}")
    else:
        assert got == want and type(got) is type(want), f"{path}: {got!r} != {want!r}"


def test_every_mapped_setting_has_its_hand_derived_value(conversion):
    _nested_equal(conversion.config, EXPECTED)


def test_the_settings_it_cannot_map_are_listed_with_why(conversion):
    assert {k for k, _, _ in conversion.unmapped} == UNMAPPED_KEYS
    why = {k: w for k, _, w in conversion.unmapped}
    assert "constant learning rate" in why["actor_rollout_ref.actor.optim.lr_warmup_steps_ratio"]
    assert "top-k" in why["actor_rollout_ref.rollout.top_k"]
    assert conversion.ignored == ["trainer.balance_batch"]


def test_the_mini_batch_size_becomes_a_count_and_says_so(conversion):
    line = next(m for m in conversion.mapped if m[1] == "optim.mini_batches")
    assert line[2] == 4 and "a count: ceil(train_batch_size 64 / ppo_mini_batch_size 16)" in line[3]


def test_verl_defaults_apply_only_when_asked(tmp_path):
    flat = read_verl(None, ["algorithm.adv_estimator=grpo", "actor_rollout_ref.rollout.n=4"])
    with_defaults, without = convert_verl(flat), convert_verl(flat, verl_defaults=False)
    # verl's symmetric clip 0.2, dual-clip 3.0, weight decay 0.01 and 512-token responses
    loss, optim = with_defaults.config["loss"], with_defaults.config["optim"]
    assert (loss["eps_low"], loss["eps_high"], loss["dual_clip_c"], optim["weight_decay"]) == (0.2, 0.2, 3.0, 0.01)
    assert with_defaults.config["rollout"]["max_new_tokens"] == 512
    assert "eps_high" not in without.config["loss"] and "optim" not in without.config
    assert without.config["rollout"] == {"samples_per_prompt": 4}


def test_an_unknown_estimator_and_unknown_keys_are_unmapped():
    flat = read_verl(None, ["algorithm.adv_estimator=gae", "critic.optim.lr=1e-5", "trainer.my_key=1"])
    why = {k: w for k, _, w in convert_verl(flat).unmapped}
    assert "GRPO group advantages only" in why["algorithm.adv_estimator"]
    assert "no critic" in why["critic.optim.lr"]
    assert "not a verl setting this converter knows" in why["trainer.my_key"]


@pytest.mark.parametrize(
    "text, value",
    [("1e-6", 1e-6), ("3", 3), ("True", True), ("null", None), ("[a,b]", ["a", "b"]), ("'left'", "left"),
     ("0.28", 0.28), ("token-mean", "token-mean")],
)  # fmt: skip
def test_override_values_parse_as_hydra_parses_them(text, value):
    assert parse_value(text) == value and type(parse_value(text)) is type(value)


def test_every_table_key_is_in_the_docs():
    from pathlib import Path

    docs = (Path(__file__).parents[2] / "docs" / "from-verl.md").read_text()
    missing = [k for k in [*MAPPED, *UNMAPPED] if f"`{k.rstrip('.')}" not in docs]
    assert not missing, f"docs/from-verl.md lacks {missing}"
    assert NOT_NEEDED  # listed by the converter as not needed


@pytest.mark.skipif("epochs" not in DataSection.model_fields, reason="needs data.epochs, loss.ref_kl (their branch)")
def test_the_conversion_is_a_valid_stare_config(conversion):
    from stare.config import build_config

    cfg = build_config(conversion.config)
    assert (cfg.optim.mini_batches, cfg.loss.eps_high, cfg.reward.components[1].config.cache_length) == (4, 0.28, 512)


def test_the_cli_prints_the_yaml_and_the_report(tmp_path):
    (tmp_path / "verl.yaml").write_text(VERL_YAML)
    proc = subprocess.run(
        [sys.executable, "-m", "stare.app.cli", "convert-verl", str(tmp_path / "verl.yaml"), *OVERRIDES, "--strict"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr  # --strict: something was not mapped
    assert yaml.safe_load(proc.stdout) == EXPECTED
    assert "not mapped (5):" in proc.stderr and "trainer.n_gpus_per_node = 8" in proc.stderr


@pytest.mark.skipif("epochs" not in DataSection.model_fields, reason="needs data.epochs, loss.ref_kl (their branch)")
def test_train_from_verl_merges_the_conversion_over_the_config_and_set_wins(tmp_path):
    from stare.app.cli.args import _load
    from stare.app.cli.parser import parse_args

    (tmp_path / "verl.yaml").write_text(VERL_YAML)
    (tmp_path / "base.yaml").write_text("run: {name: mine, seed: 3}\ncontroller: {target: 0.25}\n")
    args = parse_args(["train", "--from-verl", str(tmp_path / "verl.yaml"), "--verl-set", "data.train_batch_size=32",
                       "--config", str(tmp_path / "base.yaml"), "--algo", "stare", "--set", "optim.lr=2e-6"])  # fmt: skip
    cfg = _load(args)
    assert (cfg.rollout.prompts_per_step, cfg.optim.mini_batches) == (32, 2)  # 32 / 16: the override converted
    assert (cfg.run.seed, cfg.controller.target) == (3, 0.25)  # the base config's own fields stay
    assert (cfg.loss.name, cfg.loss.eps_high, cfg.optim.lr) == ("stare", 0.28, 2e-6)  # --algo keeps the clip
