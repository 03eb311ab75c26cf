"""Translate a verl config (a hydra YAML file and/or `key=value` overrides) into stare's config.

    conversion = convert_verl(read_verl(path, overrides))
    conversion.config     # the stare fields it sets, nested: merge it over a stare config (or use it alone)
    conversion.report()   # mapped (verl key -> stare field = value), not mapped (with why), not needed

verl's defaults (stare.config.verl_table) are applied first for the settings a run's meaning depends on,
so a converted run means what it meant in verl; `verl_defaults=False` leaves unset keys at stare's.
Overrides in hydra's grammar, as verl launch scripts write them: `a.b=v`, `+a.b=v` (add), `++a.b=v`
(force), `~a.b` (delete); values parse as hydra parses them (`1e-6` is a float, `[a,b]` a list, `'x'` a
string); `${a.b}`, `${oc.select:a.b,default}` and `${oc.env:VAR,default}` resolve against the config given
and verl's defaults.

Not covered: hydra's `defaults:` composition (verl's own config groups are not read: the table holds
their defaults), sweeps (`a=1,2`), interpolations into keys the config does not hold.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

from stare.config.verl_parse import Conversion, Ctx, flatten, matches, parse_value, read_verl
from stare.config.verl_table import MAPPED, NOT_NEEDED, UNMAPPED

__all__ = ["Conversion", "convert_verl", "flatten", "parse_value", "read_verl"]

A, R = "actor_rollout_ref.actor.", "actor_rollout_ref.rollout."


def convert_verl(user: dict[str, Any], *, verl_defaults: bool = True) -> Conversion:
    """The stare config of the verl settings `user` (flat, from `read_verl`); see the module docstring."""
    c = Ctx(user, verl_defaults)
    for rule in (_plain, _data, _batches, _loss, _algorithm, _rollout, _reward, _trainer):
        rule(c)
    for key in sorted(c.user):
        if key in c.read:
            continue
        why = next((w for k, w in UNMAPPED.items() if matches(key, k)), None)
        if why is not None:
            c.unmapped(key, why)
        elif any(matches(key, k) for k in NOT_NEEDED):
            c.out.ignored.append(key)
        else:
            c.unmapped(key, "not a verl setting this converter knows (docs/from-verl.md lists those it maps)")
    return c.out


# keys with a stare field of their own that a rule below reads instead (with others, or to transform them)
_BY_RULE = {
    "data.train_files", "data.val_files", "data.max_response_length", "data.train_max_samples",
    "data.val_max_samples", A + "optim.clip_grad", A + "grad_clip", A + "clip_ratio_low", A + "clip_ratio_high",
    A + "kl_loss_coef", A + "kl_loss_type", A + "entropy_coeff", R + "name", R + "response_length",
    R + "prompt_length", R + "val_kwargs.temperature", "trainer.total_epochs", "trainer.total_training_steps",
    "trainer.max_actor_ckpt_to_keep", "trainer.log_val_generations",
}  # fmt: skip
_VLLM = {R + k for k in ("gpu_memory_utilization", "tensor_model_parallel_size", "max_num_batched_tokens",
                         "max_num_seqs", "max_model_len", "enforce_eager", "enable_prefix_caching")}  # fmt: skip
_LOSS_MODE = {
    A + "policy_loss.clip_cov_ratio": "clip_cov",
    A + "policy_loss.clip_cov_lb": "clip_cov",
    A + "policy_loss.clip_cov_ub": "clip_cov",
    A + "policy_loss.kl_cov_ratio": "kl_cov",
    A + "policy_loss.ppo_kl_coef": "kl_cov",
}


def _plain(c: Ctx) -> None:
    """One verl key, one stare field, the value as it is."""
    engine = c.values.get(R + "name")
    for key, (stare, _, note) in MAPPED.items():
        if stare is None or key in _BY_RULE or key in _LOSS_MODE or key not in c.values:
            continue
        if key in _VLLM and engine != "vllm":
            if c.given(key):
                c.unmapped(key, f"a vLLM setting, and {R}name is {engine!r}")
            continue
        value = c.get(key)
        if value is not None:
            c.set(stare, value, key, note)


def _data(c: Ctx) -> None:
    files = c.get("data.train_files")
    files = files[0] if isinstance(files, list) and len(files) == 1 else files
    if isinstance(files, list):
        c.unmapped("data.train_files", "stare reads one training file: concatenate them (scripts/prepare_data.py)")
    elif files is not None:
        c.set("task.name", "dataset", "data.train_files", "a verl-format parquet or jsonl file")
        c.set("task.path", str(files), "data.train_files")
    val = c.get("data.val_files")
    if val is not None:
        c.set("task.test_path", [str(v) for v in val] if isinstance(val, list) else str(val), "data.val_files")
    length = c.get(R + "response_length") if c.given(R + "response_length") else c.get("data.max_response_length")
    c.get(R + "prompt_length")
    if length is not None:
        c.set("rollout.max_new_tokens", length, "data.max_response_length", "response tokens")
    if c.get("data.filter_overlong_prompts"):
        c.set("data.prompt_overflow", "reject", "data.filter_overlong_prompts", "overlong prompts dropped, logged")
        c.get("data.truncation")
    else:
        truncation = c.get("data.truncation")
        if truncation == "left":
            c.set("data.prompt_overflow", "truncate_left", "data.truncation", "keeps a prompt's last tokens")
        elif truncation == "error":
            c.set("data.prompt_overflow", "reject", "data.truncation", "verl stops at an overlong prompt; stare drops "
                  "it with a logged line")  # fmt: skip
        elif truncation is not None:
            c.unmapped("data.truncation", "stare truncates on the left or rejects (data.prompt_overflow)")
    if c.get("data.shuffle", True) is False:
        c.unmapped("data.shuffle", "stare always draws prompts in a seeded shuffled order (run.seed)")
    for key, want in (("data.prompt_key", "prompt"), ("data.reward_fn_key", "data_source")):
        if c.get(key, want) != want:
            c.unmapped(key, f"stare reads the {want!r} column: rename the column in the file")
    most = c.get("data.train_max_samples")
    if isinstance(most, int) and most > 0:
        c.set("data.max_prompts", most, "data.train_max_samples")
    val_most = c.get("data.val_max_samples")
    if isinstance(val_most, int) and val_most > 0:
        c.set("task.eval_problems", val_most, "data.val_max_samples")


def _batches(c: Ctx) -> None:
    prompts, mini = c.get("data.train_batch_size"), c.get(A + "ppo_mini_batch_size")
    if prompts and mini:
        count = max(1, math.ceil(prompts / mini))
        note = f"a count: ceil(train_batch_size {prompts} / ppo_mini_batch_size {mini})"
        if prompts % mini:
            note += "; verl's last mini-batch is smaller, stare's shares of whole groups are as equal as they go"
        c.set("optim.mini_batches", count, f"{A}ppo_mini_batch_size + data.train_batch_size", note)
    budget = c.get(A + "ppo_max_token_len_per_gpu")
    if c.get(A + "use_dynamic_bsz"):
        c.set("optim.max_tokens_per_micro_batch", budget, f"{A}use_dynamic_bsz + {A}ppo_max_token_len_per_gpu",
              "tokens per micro-batch per rank")  # fmt: skip
    gen = c.get("data.gen_batch_size")
    if gen is not None and prompts:
        if gen >= prompts:
            c.set("data.oversample", min(gen / prompts, 10.0), "data.gen_batch_size + data.train_batch_size",
                  f"groups sampled per group trained: {gen} / {prompts}")  # fmt: skip
        else:
            c.unmapped("data.gen_batch_size", "smaller than train_batch_size: stare samples at least a step's groups")
    for key in (A + "optim.lr_warmup_steps", A + "optim.lr_warmup_steps_ratio"):
        value = c.get(key)
        if value is not None and value > 0:
            c.unmapped(key, "no warmup: stare trains at a constant learning rate")
    for key in (A + "optim.warmup_style", A + "optim.lr_scheduler_type"):
        if c.get(key) not in (None, "constant"):
            c.unmapped(key, "no learning-rate schedule: stare trains at a constant learning rate")
    clip_key = A + ("optim.clip_grad" if c.given(A + "optim.clip_grad") else "grad_clip")
    if c.get(A + "optim.clip_grad") is not None or c.get(A + "grad_clip") is not None:
        c.set("optim.grad_clip", c.get(clip_key), clip_key)


_KL = {"kl": "k1", "k1": "k1", "mse": "k2", "k2": "k2", "low_var_kl": "k3", "k3": "k3"}
_LOSSES = {"vanilla": "grpo", "clip_cov": "clip-cov", "kl_cov": "kl-cov"}


def _loss(c: Ctx) -> None:
    mode = c.get(A + "policy_loss.loss_mode")
    if mode is not None and mode not in _LOSSES:
        c.unmapped(A + "policy_loss.loss_mode", f"no stare loss {mode!r}: the converted config trains grpo "
                   "(stare's losses: stare, grpo, clip-cov, kl-cov, entropy-bonus, 80-20)")  # fmt: skip
    name = _LOSSES.get(mode, "grpo")
    c.set("loss.name", name, A + "policy_loss.loss_mode")
    for key, wants in _LOSS_MODE.items():
        if key in c.values and mode == wants:
            c.set(MAPPED[key][0] or "", c.get(key), key)
        elif c.given(key):
            c.unmapped(key, f"applies to loss_mode {wants} only")
    both = c.get(A + "clip_ratio")
    for side, stare in (("low", "loss.eps_low"), ("high", "loss.eps_high")):
        key = A + f"clip_ratio_{side}"
        value, source = (c.get(key), key) if c.given(key) else (both, A + "clip_ratio")
        if value is not None:
            c.set(stare, value, source, "stare's default is 0.28" if side == "high" else "")
    if c.get(A + "loss_agg_mode") == "seq-mean-token-sum-norm":
        norm = c.get(A + "loss_scale_factor") or c.values.get("data.max_response_length")
        if norm:
            c.set("loss.norm_length", int(norm), A + "loss_scale_factor", "the constant divisor")
    if coef := c.get(A + "entropy_coeff"):
        c.set("loss.entropy_coef", coef, A + "entropy_coeff", "an entropy bonus on the loss")
    coef, kind = c.get(A + "kl_loss_coef"), c.get(A + "kl_loss_type")
    if c.get(A + "use_kl_loss"):
        estimator = _KL.get(str(kind))
        if estimator is None:
            c.unmapped(A + "kl_loss_type", "stare's estimators are k1, k2, k3 (verl's kl, mse, low_var_kl); not abs, "
                       "full or the straight-through '+' forms")  # fmt: skip
        else:
            c.set("loss.ref_kl", {"coef": coef, "estimator": estimator},
                  f"{A}use_kl_loss + {A}kl_loss_coef + {A}kl_loss_type", "KL to a frozen reference model")  # fmt: skip


def _algorithm(c: Ctx) -> None:
    if c.get("algorithm.adv_estimator") != "grpo":
        c.unmapped("algorithm.adv_estimator", "stare computes GRPO group advantages only: set grpo (verl's default, "
                   "gae, needs a critic)")  # fmt: skip
    if c.get("algorithm.use_kl_in_reward"):
        c.unmapped("algorithm.use_kl_in_reward", "no KL in the reward: use the KL loss (use_kl_loss -> loss.ref_kl)")
    else:  # its settings are inert without it
        c.read.update(k for k in c.user if matches(k, "algorithm.kl_ctrl.") or k == "algorithm.kl_penalty")
    filtering = c.get("algorithm.filter_groups.enable")
    metric = c.get("algorithm.filter_groups.metric")
    rounds = c.get("algorithm.filter_groups.max_num_gen_batches")
    if filtering:
        if metric not in (None, "acc", "score", "seq_reward", "seq_final_reward"):
            c.unmapped("algorithm.filter_groups.metric", "stare filters the groups whose rewards are all equal")
        if rounds is not None and rounds > 0:
            c.set("data.max_sampling_rounds", rounds, "algorithm.filter_groups.max_num_gen_batches")
        elif rounds is not None:
            c.unmapped("algorithm.filter_groups.max_num_gen_batches", "verl's <= 0 is no limit: stare needs one "
                       "(data.max_sampling_rounds, default 10)")  # fmt: skip
    _rollout_correction(c)
    loss = c.out.config["loss"]
    clip_higher = loss.get("eps_high", 0.28) > loss.get("eps_low", 0.2)
    algo = "dapo" if filtering and clip_higher and loss["name"] == "grpo" else loss["name"]
    c.set("algo", algo, "algorithm.filter_groups.enable", "informational: the metrics' algo")


def _rollout_correction(c: Ctx) -> None:
    p = "algorithm.rollout_correction."
    section: dict[str, Any] = {}
    level, cap = c.get(p + "rollout_is"), c.get(p + "rollout_is_threshold")
    if level in ("token", "sequence"):
        section.update(is_level=level, **({"is_cap": float(cap)} if cap is not None else {}))
    elif level is not None:
        c.unmapped(p + "rollout_is", "stare's truncated IS is token or sequence")
    mode, threshold = c.get(p + "rollout_rs"), c.get(p + "rollout_rs_threshold")
    masks = {"token_k1": "token", "seq_sum_k1": "sequence", "seq_mean_k1": "geometric"}
    if mode in masks:
        section["mask_level"] = masks[mode]
        if isinstance(threshold, str) and "_" in threshold:
            low, high = threshold.split("_", 1)
            section.update(mask_low=float(low), mask_high=float(high))
        elif threshold is not None:
            section["mask_high"] = float(threshold)  # the lower bound its reciprocal, as in verl
    elif mode is not None:
        c.unmapped(p + "rollout_rs", "stare's masks are verl's token_k1, seq_sum_k1 and seq_mean_k1 (ratio bounds)")
    for key in ("rollout_is_batch_normalize", "bypass_mode"):
        if c.get(p + key):
            c.unmapped(p + key, "no counterpart in stare's rollout correction (docs/algorithm.md)")
    if section:
        c.set("loss.rollout_correction", section, f"{p}rollout_is + {p}rollout_rs")


def _rollout(c: Ctx) -> None:
    engine = c.get(R + "name")
    if engine in ("vllm", "hf"):
        c.set("rollout.engine.name", engine, R + "name")
    elif engine is not None:
        c.unmapped(R + "name", "stare's engines are vllm and hf (transformers)")
    for key in (R + "top_k", R + "val_kwargs.top_k"):
        if c.get(key) not in (None, -1, 0):
            c.unmapped(key, "stare samples without top-k")
    if c.get(R + "val_kwargs.do_sample", True) is False:
        c.unmapped(R + "val_kwargs.do_sample", "stare decodes each held-out problem greedily (greedy_accuracy) and "
                   "also samples task.eval_k of them")  # fmt: skip
    temperature = c.get(R + "val_kwargs.temperature")
    if temperature:  # 0 (verl's greedy default): stare's greedy_accuracy is that evaluation
        c.set("task.eval_temperature", temperature, R + "val_kwargs.temperature")
    if c.get("trainer.val_before_train", True) is False:
        c.unmapped("trainer.val_before_train", "stare always evaluates at the start")


def _overlong(c: Ctx) -> dict[str, Any] | None:
    """DAPO's soft overlong punishment as a reward component (either way verl spells it), or None."""
    kw = "reward_model.reward_kwargs."
    found = None
    for base in ("reward_model.overlong_buffer.", kw + "overlong_buffer_cfg."):
        enabled, length = c.get(base + "enable"), c.get(base + "len")
        factor, _ = c.get(base + "penalty_factor"), c.get(base + "log")
        if enabled and found is None:
            max_length = c.get(kw + "max_resp_len") or c.values.get("data.max_response_length")
            found = {
                "max_length": max_length,
                "cache_length": length,
                "penalty_factor": 1.0 if factor is None else factor,
            }
            c.record(f"{base}enable + {base}len + {base}penalty_factor", "reward.components[kind overlong]", found,
                     "DAPO's soft overlong punishment, added to the reward")  # fmt: skip
    c.get(kw + "max_resp_len")
    return None if found is None else {"kind": "overlong", "config": found}


def _reward(c: Ctx) -> None:
    components: list[dict[str, Any]] = []
    path, name = c.get("custom_reward_function.path"), c.get("custom_reward_function.name")
    if path:
        function: dict[str, Any] = {"kind": "function", "path": str(path), "function": name or "compute_score"}
        prefix = "custom_reward_function.reward_kwargs."
        kwargs = {k[len(prefix) :]: v for k, v in c.values.items() if k.startswith(prefix)}
        c.read.update(prefix + k for k in kwargs)
        if kwargs:
            function["kwargs"] = kwargs
        components.append(function)
    manager = c.get("reward_model.reward_manager")
    if manager not in (None, "naive", "dapo", "batch"):
        c.unmapped("reward_model.reward_manager", "stare scores each response alone (naive, dapo and batch map)")
    overlong = _overlong(c)
    if overlong is not None:
        components.append(overlong)
        if not path:  # the shaping is added to the dataset's own verifier
            components.insert(0, {"kind": "task"})
    if components:
        c.out.config["reward"] = {"components": components}
    if path:
        c.record("custom_reward_function.path + custom_reward_function.name", "reward.components[kind function]",
                 components[0], "scored in stare's scoring processes (docs/reward.md)")  # fmt: skip


def _trainer(c: Ctx) -> None:
    steps, epochs = c.get("trainer.total_training_steps"), c.get("trainer.total_epochs")
    if steps is not None:
        c.set("run.steps", steps, "trainer.total_training_steps")
    elif epochs is not None:
        c.set("run.steps", None, "trainer.total_epochs", "derived from data.epochs")
    if epochs is not None:
        c.set("data.epochs", epochs, "trainer.total_epochs", "passes over the training file")
    for key, stare, what in (("trainer.test_freq", "task.eval_every", "at the start and the end only"),
                             ("trainer.save_freq", "run.checkpoint_every", "at the end only")):  # fmt: skip
        value = c.get(key)
        if value is not None:
            c.set(stare, value if value > 0 else 1_000_000, key, "" if value > 0 else f"-1: {what}")
    if keep := c.get("trainer.max_actor_ckpt_to_keep"):
        c.set("run.keep_checkpoints", keep, "trainer.max_actor_ckpt_to_keep")
    if (generations := c.get("trainer.log_val_generations")) is not None:
        c.set("logging.eval_generations", generations, "trainer.log_val_generations", "per data source in stare")
    folder, name = c.get("trainer.default_local_dir"), c.get("trainer.experiment_name")
    if folder is not None:
        c.set("run.output_dir", str(Path(str(folder)).parent), "trainer.default_local_dir")
        name = name if name is not None else Path(str(folder)).name
    if name is not None:
        c.set("run.name", re.sub(r"[^A-Za-z0-9._-]+", "-", str(name)).strip("-") or "verl", "trainer.experiment_name")
    loggers = c.get("trainer.logger")
    loggers = [loggers] if isinstance(loggers, str) else list(loggers or [])
    project = c.get("trainer.project_name")
    if "wandb" in loggers:
        c.set("logging.wandb", {"project": str(project or "verl_examples")}, "trainer.logger + trainer.project_name",
              "pip install 'stare[wandb]'")  # fmt: skip
    other = [x for x in loggers if x not in ("console", "wandb", "tensorboard")]
    if other:
        c.unmapped("trainer.logger", f"stare logs to the console, TensorBoard and W&B; not {other}")
