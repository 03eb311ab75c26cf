"""The learner: one optimizer step of STARE (or a baseline) on a batch of scored trajectories.

    step = collate -> pre-step no-grad pass (old log-probs, entropy) -> gather the step's tokens
           -> gate (one host sync: the batch entropy) -> plan_step (thresholds, normalisers)
           -> micro-batches: forward, policy loss, backward -> DeepSpeed optimizer step
           -> controller update -> metrics (reduced once, read once)

Recipe shape (torchtune): setup in __init__, `train_step`, `save`, `load`, `state_dict_for_rollout`.
No implementation inheritance, no per-micro-batch host sync: metrics are summed as tensors and
read at the step boundary.
"""

from __future__ import annotations

import json
import math
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from stare.config import TrainConfig
from stare.learner import deepspeed_engine as ds
from stare.learner.batch import TrainBatch, collate, token_logprobs_and_entropy
from stare.learner.collectives import all_reduce_sum, gather_step_tokens
from stare.algo_config import StareLossConfig
from stare.learner.controller import EntropyController
from stare.learner.diagnostics import predicted_entropy_change, quadrant_metrics, quadrant_sums
from stare.learner.policy_loss import LossInputs, policy_loss
from stare.learner.step_plan import StepTokens, mean_entropy, plan_step
from stare.records import Trajectory


class Learner:
    def __init__(self, cfg: TrainConfig, model_path: Path, pad_id: int):
        from transformers import AutoModelForCausalLM

        self.cfg = cfg
        self.pad_id = pad_id
        ds.init_distributed()
        self.world = dist.get_world_size()
        torch.manual_seed(cfg.run.seed)
        dtype = torch.bfloat16 if cfg.model.dtype == "bfloat16" else torch.float32
        model = AutoModelForCausalLM.from_pretrained(model_path, dtype=dtype)
        rows = cfg.rollout.prompts_per_step * cfg.rollout.samples_per_prompt
        self.micro = min(cfg.optim.micro_batch, rows)
        self.grad_accum = math.ceil(rows / self.micro)
        self.rows = self.micro * self.grad_accum
        o = cfg.optim
        self.engine = ds.build_engine(model, ds.deepspeed_config(
            micro_batch=self.micro, grad_accum=self.grad_accum, world_size=self.world, lr=o.lr, betas=o.betas,
            weight_decay=o.weight_decay, grad_clip=o.grad_clip, zero_stage=o.zero_stage, bf16=dtype == torch.bfloat16,
        ))
        self.controller = EntropyController(cfg.controller)
        self.step = 0
        self.version = 0
        self.lagged_entropy: float | None = None

    # -- one step -------------------------------------------------------------------------------

    def _forward(self, mb: TrainBatch) -> torch.Tensor:  # [B, P + L, V]
        return self.engine(input_ids=mb.input_ids, attention_mask=mb.attention_mask, position_ids=mb.position_ids).logits

    def _micro_batches(self, batch: TrainBatch):
        for i in range(self.grad_accum):
            sl = slice(i * self.micro, (i + 1) * self.micro)
            yield sl, batch.rows(sl)

    @torch.no_grad()
    def _prepass(self, batch: TrainBatch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Old log-probs, entropy and (optionally) the predicted entropy change, each [S, L]."""
        S, L = batch.mask.shape
        old = torch.zeros(S, L)
        ent = torch.zeros(S, L)
        dh = torch.zeros(S, L)
        self.engine.eval()
        for sl, mb in self._micro_batches(batch):
            logits = self._forward(mb)
            logp, entropy = token_logprobs_and_entropy(logits, mb)
            n = logp.shape[1]
            old[sl, :n], ent[sl, :n] = logp, entropy
            if self.cfg.diagnostics.predicted_entropy_change:
                P = mb.prompt_width
                full = torch.log_softmax(logits[:, P - 1 : P - 1 + n].float(), -1)  # [B, n, V]
                dh[sl, :n] = predicted_entropy_change(full, mb.response_ids, mb.advantages, eta=1.0)
        self.engine.train()
        return old, ent, dh

    def train_step(self, trajectories: list[Trajectory]) -> dict[str, Any]:
        cfg = self.cfg
        t0 = time.perf_counter()
        batch = collate(trajectories, pad_id=self.pad_id, rows=self.rows, scale_by_std=cfg.data.advantage_std)
        old, ent0, dh = self._prepass(batch)
        tokens = gather_step_tokens(StepTokens(old, ent0, batch.advantages, batch.token_uid, batch.mask))
        h_step = mean_entropy(tokens.entropy, tokens.mask, cfg.loss.agg_mode)  # []
        h_prepass = float(h_step)  # host sync: once per step, before the first backward
        h_gate = self.lagged_entropy if (self.controller.cfg.entropy_source == "lagged" and self.lagged_entropy is not None) else h_prepass
        is_stare = isinstance(cfg.loss, StareLossConfig)  # the controller steers STARE only
        gate = self.controller.decide(h_gate) if is_stare else False
        w, m = (self.controller.w, self.controller.m) if is_stare else (1.0, 1.0)
        ctx = plan_step(tokens, cfg.loss, gate=float(gate), w=w, m=m,
                        seed=cfg.run.seed * 1_000_003 + self.step)
        t_plan = time.perf_counter()

        sums: dict[str, torch.Tensor] = defaultdict(lambda: torch.zeros((), dtype=torch.float64))
        quadrants = torch.zeros(4, 5, dtype=torch.float64)
        for sl, mb in self._micro_batches(batch):
            logits = self._forward(mb)
            logprobs, entropy = token_logprobs_and_entropy(logits, mb)
            n = logprobs.shape[1]
            x = LossInputs(
                logprobs=logprobs, old_logprobs=old[sl, :n], advantages=mb.advantages, mask=mb.mask,
                token_uid=mb.token_uid, entropy=entropy, step_entropy=ent0[sl, :n], rollout_logprobs=mb.rollout_logprobs,
            )
            out = policy_loss(x, ctx, cfg.loss)
            ds.backward(self.engine, out.loss * self.world)  # DeepSpeed averages over ranks
            self.engine.step()
            sums["loss"] += out.loss.detach().double()
            sums["train_entropy_sum"] += (entropy.detach() * mb.mask).sum().double()
            # learner vs rollout-engine log-prob mismatch (what TIS corrects)
            sums["rollout_logprob_gap_sum"] += ((old[sl, :n] - mb.rollout_logprobs).abs() * mb.mask).sum().double()
            for k, v in out.metrics.items():
                sums[k] += v.detach().double()
            quadrants += quadrant_sums(mb.advantages.double(), -old[sl, :n].double(), mb.mask, h_step.double(), dh[sl, :n].double())
        if is_stare:
            self.controller.update(h_prepass)
        self.step += 1
        self.version += 1
        t_end = time.perf_counter()

        # Step boundary: reduce once, read once.
        names = sorted(sums)
        reduced = all_reduce_sum(torch.stack([sums[k] for k in names]))
        quadrants = all_reduce_sum(quadrants)
        totals = dict(zip(names, reduced.tolist()))
        n_tokens = max(float(ctx.norm.num_tokens), 1.0)
        self.lagged_entropy = totals.pop("train_entropy_sum") / max(float(batch.mask.sum()), 1.0)
        metrics: dict[str, Any] = {
            "step": self.step,
            "weight_version": self.version,
            "loss": totals.pop("loss"),
            "entropy": h_prepass,
            "entropy_gate_input": h_gate,
            "gate": int(gate),
            "w": self.controller.w if is_stare else 1.0,
            "m": self.controller.m if is_stare else 1.0,
            "target": self.controller.target,
            "band_low": self.controller.band[0] if self.controller.band else None,
            "band_high": self.controller.band[1] if self.controller.band else None,
            "clip_fraction": totals.pop("clipped_tokens", 0.0) / n_tokens,
            "grad_norm": ds.grad_norm(self.engine),
            "train_tokens": float(batch.mask.sum()),
            "time_learn_s": t_end - t0,
            "time_plan_s": t_plan - t0,
        }
        metrics["rollout_logprob_gap"] = totals.pop("rollout_logprob_gap_sum") / max(float(batch.mask.sum()), 1.0)
        metrics.update({k: v for k, v in totals.items()})
        metrics.update({k: float(v) for k, v in quadrant_metrics(quadrants).items()})
        return metrics

    # -- weights and checkpoints --------------------------------------------------------------

    def state_dict_for_rollout(self) -> dict[str, torch.Tensor]:
        return ds.full_state_dict(self.engine)

    def save(self, directory: Path, extra: dict[str, Any]) -> str:
        tag = f"step_{self.step:06d}"
        ds.save_checkpoint(self.engine, directory, tag)
        state = {
            "step": self.step,
            "version": self.version,
            "controller": self.controller.state_dict(),
            "lagged_entropy": self.lagged_entropy,
            **extra,
        }
        (directory / tag / "trainer_state.json").write_text(json.dumps(state, indent=1))
        (directory / "latest").write_text(tag)
        return tag

    def load(self, directory: Path, tag: str | None = None) -> dict[str, Any]:
        tag = tag or (directory / "latest").read_text().strip()
        ds.load_checkpoint(self.engine, directory, tag)
        state = json.loads((directory / tag / "trainer_state.json").read_text())
        self.step, self.version = state["step"], state["version"]
        self.controller.load_state_dict(state["controller"])
        self.lagged_entropy = state["lagged_entropy"]
        return state
