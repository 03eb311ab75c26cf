"""The learner's step through DeepSpeed vs a plain torch loop computing the same loss, same run.

  * ours:     `Learner.train_step` (stare/learner/trainer.py): collate, the no-grad pre-pass (old
              log-probs, entropy), the entropy gate, `plan_step`, micro-batches of forward +
              `policy_loss` + DeepSpeed backward/step (ZeRO stage and grad clipping of the config),
              the controller update, diagnostics and metrics read once at the step boundary;
  * baseline: the same collate, pre-pass, gate, `plan_step`, `token_logprobs_and_entropy` and
              `policy_loss`, with `loss.backward()`, `clip_grad_norm_` and `torch.optim.AdamW`:
              no DeepSpeed, no diagnostics.
Both start from the same weights; the first (uncounted) step of each must give the same loss (to
1e-5) and the same updated weights (to 5% of the step's largest update; checked: a bench whose
baseline computes something else is worthless).
Then steps alternate, rotating which goes first, each pair on a fresh batch of synthetic groups
(random tokens of the model's vocabulary, long-tailed response lengths, mixed rewards). Ratio =
ours tokens/s over the baseline's (target >= 0.9). Runs on the tiny config (`stare train`'s
learner: one process, gloo).

A second row, `learner-no-prepass`: the step without its pre-pass (`loss.selection_keys: rollout`) over
the same learner with it, both gating on the lagged entropy (target >= 1.1: the pre-pass is a no-grad
forward, about a quarter of a step's compute without recompute).

Usage: `stare bench learner` (quick: `--quick`).
"""

from __future__ import annotations

import math
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from stare.app.bench.common import paired_row, timed, tiny_config

TARGET = 0.9
DRIFT_OF_UPDATE = 0.05  # after the first step: the two updates agree to 5% of the largest update
QUICK = dict(repeats=5)
FULL = dict(repeats=11)


def synthetic_groups(
    n_groups: int, group_size: int, vocab: int, max_response: int, *, prompt_len: int = 12, seed: int = 0, step: int = 0
) -> list:
    """Scored trajectories: whole groups with mixed 0/1 rewards, response lengths long-tailed in
    [1, max_response] (most short, a few at the limit, like sampled answers)."""
    from stare.transport.records import Trajectory

    rng = np.random.default_rng([seed, step])
    out = []
    for g in range(n_groups):
        prompt = rng.integers(0, vocab, rng.integers(prompt_len // 2, prompt_len + 1), dtype=np.int32)
        rewards = rng.permutation([1.0] * (group_size // 2) + [0.0] * (group_size - group_size // 2))
        for j in range(group_size):
            n = int(min(max_response, max(1, rng.geometric(4.0 / max_response))))
            out.append(
                Trajectory(
                    run_id="bench",
                    trajectory_id=f"s{step}g{g}:{j}",
                    group_id=f"s{step}g{g}",
                    group_size=group_size,
                    weight_version=0,
                    prompt_token_ids=prompt,
                    response_token_ids=rng.integers(0, vocab, n, dtype=np.int32),
                    response_logprobs=-rng.exponential(1.0, n).astype(np.float32),
                    loss_mask=np.ones(n, dtype=np.uint8),
                    finish_reason="stop" if n < max_response else "length",
                    answer="0",
                    problem_id=f"p{g}",
                    data_source="bench",
                    response_text="",
                    reward=float(rewards[j]),
                )
            )
    return out


class PlainLoop:
    """The learner's loss in a plain torch training loop (the baseline): no DeepSpeed."""

    def __init__(self, cfg, model_path: Path, pad_id: int):
        from transformers import AutoModelForCausalLM

        from learner.algorithm.entropy_controller import EntropyController

        self.cfg, self.pad_id = cfg, pad_id
        dtype = torch.bfloat16 if cfg.model.dtype == "bfloat16" else torch.float32
        self.model = AutoModelForCausalLM.from_pretrained(model_path, dtype=dtype)
        o = cfg.optim
        self.opt = torch.optim.AdamW(
            self.model.parameters(), lr=o.lr, betas=tuple(o.betas), weight_decay=o.weight_decay
        )
        rows = cfg.rollout.prompts_per_step * cfg.rollout.samples_per_prompt
        self.micro = min(o.micro_batch, rows)
        self.grad_accum = math.ceil(rows / self.micro)
        self.rows = self.micro * self.grad_accum
        self.controller = EntropyController(cfg.controller)
        self.step_count = 0

    def _forward(self, mb):
        return self.model(input_ids=mb.input_ids, attention_mask=mb.attention_mask, position_ids=mb.position_ids).logits

    def step(self, trajectories) -> float:
        """One optimizer step; returns the loss (the sum of the micro-batch losses)."""
        from learner.algorithm.losses import LossInputs, policy_loss
        from learner.algorithm.step_plan import StepTokens, mean_entropy, plan_step
        from learner.step.batch import collate, token_logprobs_and_entropy
        from stare.config.algo import StareLossConfig

        cfg = self.cfg
        batch = collate(trajectories, pad_id=self.pad_id, rows=self.rows, scale_by_std=cfg.data.advantage_std)
        S, L = batch.mask.shape
        old, ent = torch.zeros(S, L), torch.zeros(S, L)  # [S, L]
        micro = [(slice(i * self.micro, (i + 1) * self.micro),) for i in range(self.grad_accum)]
        micro = [(sl, batch.rows(sl)) for (sl,) in micro]
        self.model.eval()
        with torch.no_grad():
            for sl, mb in micro:
                logp, entropy = token_logprobs_and_entropy(self._forward(mb), mb)
                old[sl, : logp.shape[1]], ent[sl, : logp.shape[1]] = logp, entropy
        self.model.train()
        tokens = StepTokens(old, ent, batch.advantages, batch.token_uid, batch.mask)
        h = float(mean_entropy(ent, batch.mask, cfg.loss.agg_mode))  # host sync: once per step
        is_stare = isinstance(cfg.loss, StareLossConfig)
        gate = self.controller.begin_step(h, h) if is_stare else False  # the trainer's controller calls
        w, m = (self.controller.w, self.controller.m) if is_stare else (1.0, 1.0)
        ctx = plan_step(tokens, cfg.loss, gate=float(gate), w=w, m=m, seed=cfg.run.seed * 1_000_003 + self.step_count)
        total = torch.zeros((), dtype=torch.float64)
        for sl, mb in micro:
            logp, entropy = token_logprobs_and_entropy(self._forward(mb), mb)
            n = logp.shape[1]
            x = LossInputs(
                logprobs=logp,
                old_logprobs=old[sl, :n],
                advantages=mb.advantages,
                mask=mb.mask,
                token_uid=mb.token_uid,
                entropy=entropy,
                step_entropy=ent[sl, :n],
                rollout_logprobs=mb.rollout_logprobs,
            )
            out = policy_loss(x, ctx, cfg.loss)
            out.loss.backward()
            total += out.loss.detach().double()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.optim.grad_clip)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        if is_stare:
            self.controller.end_step(h)
        self.step_count += 1
        return float(total)  # host sync: once per step


def measure(*, repeats: int, overrides: list[str] = ()) -> list[dict[str, Any]]:
    """One row: the Learner's trained tokens/s over the plain loop's, after checking on the first
    step that both compute the same loss and update."""
    from transformers import AutoTokenizer

    from learner.step.trainer import Learner
    from stare.models.resolve import resolve_model

    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
    with tempfile.TemporaryDirectory(prefix="stare-bench-learner-") as tmp:
        cfg = tiny_config([f"run.output_dir={tmp}", *overrides])
        if cfg.run.threads is not None:
            torch.set_num_threads(cfg.run.threads)
        model_path = resolve_model(cfg, lambda s: None)
        tokenizer = AutoTokenizer.from_pretrained(model_path)
        pad_id = tokenizer.pad_token_id or 0
        ours = Learner(cfg, model_path, pad_id=pad_id)
        plain = PlainLoop(cfg, model_path, pad_id)
        r = cfg.rollout
        vocab = plain.model.config.get_text_config().vocab_size

        def batch(step: int) -> list:
            return synthetic_groups(r.prompts_per_step, r.samples_per_prompt, vocab, r.max_new_tokens, step=step)

        first = batch(0)
        init = {k: v.detach().clone() for k, v in plain.model.state_dict().items()}
        ours_loss = ours.train_step(first)["loss"]
        plain_loss = plain.step(first)
        if not math.isclose(ours_loss, plain_loss, rel_tol=1e-5, abs_tol=1e-7):
            raise AssertionError(f"the plain loop's loss {plain_loss!r} differs from the Learner's {ours_loss!r}")
        updated = ours.state_dict_for_rollout()
        drift = max(
            (updated[k].float() - v.detach().float()).abs().max().item()
            for k, v in plain.model.state_dict().items()
            if k in updated
        )
        moved = max((updated[k].float() - v.float()).abs().max().item() for k, v in init.items() if k in updated)
        # Adam's first step is lr x g / (|g| + eps): where a gradient is ~0, float-order differences
        # (chunked vs whole log-softmax, another reduction order) move a weight by a visible part of lr
        if moved == 0 or drift > DRIFT_OF_UPDATE * moved:
            raise AssertionError(
                f"after one step the plain loop's weights differ from the Learner's by {drift:.2e} "
                f"(the step moved them by up to {moved:.2e})"
            )

        times: dict[str, list[float]] = {"ours": [], "baseline": []}
        n_tokens: list[float] = []
        for k in range(repeats):
            trajectories = batch(k + 1)
            n_tokens.append(float(sum(len(t.response_token_ids) for t in trajectories)))
            arms = (("ours", lambda: ours.train_step(trajectories)), ("baseline", lambda: plain.step(trajectories)))
            for name, fn in arms if k % 2 == 0 else arms[::-1]:
                times[name].append(timed(fn))
    size = (
        f"{r.prompts_per_step} x {r.samples_per_prompt} trajectories, <= {r.max_new_tokens} tokens, "
        f"micro-batch {cfg.optim.micro_batch}, ZeRO {cfg.optim.zero_stage}, {cfg.model.dtype}"
    )
    return [
        paired_row(
            "learner",
            f"Learner.train_step (DeepSpeed) vs a plain torch loop, same loss ({size})",
            [n / t for n, t in zip(n_tokens, times["ours"])],
            [n / t for n, t in zip(n_tokens, times["baseline"])],
            unit="tokens/s",
            target=TARGET,
            first_step_loss=ours_loss,
            first_step_weight_drift=drift,
            first_step_update=moved,
        )
    ]


KEYS_TARGET = 1.1  # the pre-pass is a no-grad forward: about a quarter of a step without recompute
NO_PREPASS = ["controller.entropy_source=lagged", "diagnostics.predicted_entropy_change=false"]


def measure_selection_keys(*, repeats: int, overrides: list[str] = ()) -> list[dict[str, Any]]:
    """One row: a step that runs no pre-pass (`loss.selection_keys: rollout`, STARE's surprisal keyed on
    the rollout's log-probs) against the same config's step with the pre-pass (`learner`), tokens/s.
    Both learners gate on the lagged entropy, so the arms differ only in the pre-pass; checked: the
    rollout-keyed arm ran none after its first step."""
    from transformers import AutoTokenizer

    from learner.step.trainer import Learner
    from stare.models.resolve import resolve_model

    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
    with tempfile.TemporaryDirectory(prefix="stare-bench-keys-") as tmp:
        base = [f"run.output_dir={tmp}", *NO_PREPASS, *overrides]
        cfg = tiny_config(base)
        if cfg.run.threads is not None:
            torch.set_num_threads(cfg.run.threads)
        model_path = resolve_model(cfg, lambda s: None)
        pad_id = AutoTokenizer.from_pretrained(model_path).pad_token_id or 0
        arms = {
            "ours": Learner(tiny_config([*base, "loss.selection_keys=rollout"]), model_path, pad_id=pad_id),
            "baseline": Learner(cfg, model_path, pad_id=pad_id),
        }
        r = cfg.rollout
        vocab = arms["baseline"].engine.module.config.get_text_config().vocab_size

        def batch(step: int) -> list:
            return synthetic_groups(r.prompts_per_step, r.samples_per_prompt, vocab, r.max_new_tokens, step=step)

        for learner in arms.values():  # the first step: both run the pre-pass (nothing lagged yet)
            learner.train_step(batch(0))
        times: dict[str, list[float]] = {"ours": [], "baseline": []}
        n_tokens: list[float] = []
        prepasses = 0
        for k in range(repeats):
            trajectories = batch(k + 1)
            n_tokens.append(float(sum(len(t.response_token_ids) for t in trajectories)))
            order = ("ours", "baseline") if k % 2 == 0 else ("baseline", "ours")
            for name in order:
                t0 = time.perf_counter()
                metrics = arms[name].train_step(trajectories)
                times[name].append(time.perf_counter() - t0)
                prepasses += metrics["prepass"] if name == "ours" else 0
        if prepasses:
            raise AssertionError(f"the rollout-keyed learner ran the pre-pass on {prepasses} of {repeats} steps")
    return [
        paired_row(
            "learner-no-prepass",
            f"a step keyed on the rollout's log-probs (no pre-pass) vs the same step with the pre-pass "
            f"({r.prompts_per_step} x {r.samples_per_prompt} trajectories, <= {r.max_new_tokens} tokens)",
            [n / t for n, t in zip(n_tokens, times["ours"])],
            [n / t for n, t in zip(n_tokens, times["baseline"])],
            unit="tokens/s",
            target=KEYS_TARGET,
        )
    ]


def run(quick: bool) -> list[dict[str, Any]]:
    settings = QUICK if quick else FULL
    return measure(**settings) + measure_selection_keys(**settings)
