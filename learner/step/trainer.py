"""The learner: one optimizer step of STARE (or a baseline) on a batch of scored trajectories.

    step = collate + mini-batch and micro-batch plan (host) -> step tensors to the device
           -> pre-step no-grad pass (old log-probs, entropy, chunked; the frozen reference's log-probs with
              loss.ref_kl) over the rows not prepared ahead (`prepare`), the prepared rows' kept values copied in
              (none with loss.selection_keys rollout once an entropy is lagged: `needs_prepass`)
           -> rollout correction (IS weights, masked tokens) -> gather the step's tokens
           -> controller (one host sync: the batch entropy; W/M from it, then the gate), once per batch
           -> per update (optim.epochs x optim.mini_batches; one by default):
                plan_step over the update's tokens (thresholds, normalisers)
                -> micro-batches: forward, policy loss, backward -> DeepSpeed optimizer step
                -> the update's metric sums (reduced once, read once)
           -> (controller.order lagged: W/M update) -> step metrics

Every tensor of a step lives on the engine's device; the host syncs are listed in
docs/algorithm.md ("Host syncs").

The pre-pass ahead of a step (`prepare`, while the session waits for data): learner/step/prepass_store.py.

Recipe shape (torchtune): setup in __init__, `train_step`, `save`, `load`, `state_dict_for_rollout`.
No implementation inheritance, no per-micro-batch host sync: metrics are summed as tensors and
read once per update.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from learner.algorithm.entropy_controller import EntropyController
from learner.algorithm.quadrants import quadrant_metrics
from learner.algorithm.rollout_correction import correction_metrics, rollout_correction
from learner.algorithm.step_plan import StepTokens, mean_entropy, plan_step
from learner.engine import deepspeed_engine as ds
from learner.engine.collectives import all_gather_cat, all_reduce_sum, gather_step_tokens
from learner.step import learner_checkpoint
from learner.step.batch import collate
from learner.step.forward_passes import CORRECTION_SUMS, Policy, hidden_state_fn, prepass, train_pass
from learner.step.logprobs import attach_chunked_head
from learner.step.micro_batches import build_micro_batch, filler_micro_batch
from learner.step.ppo_updates import SEED_STRIDE, combine_updates, update_tokens
from learner.step.prepass_store import PrepassStore, head_calls, to_device, to_host, value_names
from learner.step.reference import build_reference, reference_pass
from learner.step.step_checks import check_packing_supported, nonfinite_step
from learner.step.step_rows import RankRows, StepCut, cut_step
from stare.config import TrainConfig
from stare.config.algo import StareLossConfig
from stare.config.train import keys_from_rollout
from stare.models.resolve import torch_dtype
from stare.transport.records import Trajectory
from stare.weight_sync.factory import publish_from

log = logging.getLogger(__name__)


class Learner:
    def __init__(self, cfg: TrainConfig, model_path: Path, pad_id: int):
        from transformers import AutoModelForCausalLM

        self.cfg = cfg
        self.pad_id = pad_id
        ds.init_distributed()
        self.world = dist.get_world_size()
        self.rank = dist.get_rank()
        torch.manual_seed(cfg.run.seed)
        dtype = torch_dtype(cfg.model.dtype)
        ds.check_dtype_supported(cfg.model.dtype)
        model = AutoModelForCausalLM.from_pretrained(model_path, dtype=dtype)
        o = cfg.optim
        if o.gradient_checkpointing:
            enable = getattr(model, "activation_checkpointing_enable", None)  # transformers >= 5
            if enable is not None:
                enable(activation_checkpointing_kwargs={"use_reentrant": False})
            else:
                model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        if o.max_tokens_per_micro_batch is not None and o.pack_sequences:
            check_packing_supported(model)
        self.lora = cfg.model.lora
        if self.lora is not None:  # the adapters train, the base is frozen (learner/engine/lora.py)
            from learner.engine import lora

            model = lora.wrap(model, self.lora)
        # this rank's rows: its share of the step's groups (learner.process.ranks.split_groups), padded
        rows = math.ceil(cfg.rollout.prompts_per_step / self.world) * cfg.rollout.samples_per_prompt
        self.micro = min(o.micro_batch, rows)
        self.grad_accum = math.ceil(rows / self.micro)
        self.rows = self.micro * self.grad_accum
        head = attach_chunked_head(model, o.logits_chunk_tokens)  # ZeRO-3: the head gathered once per micro-batch
        ds_config = ds.deepspeed_config(
            micro_batch=self.micro,
            grad_accum=self.grad_accum,
            world_size=self.world,
            lr=o.lr,
            betas=o.betas,
            weight_decay=o.weight_decay,
            grad_clip=o.grad_clip,
            zero_stage=o.zero_stage,
            dtype=cfg.model.dtype,
            fused_adam=torch.cuda.is_available(),
        )
        self.engine = ds.build_engine(model, ds_config, external={head: head.weight})
        self.device = ds.engine_device(self.engine)
        # the weights the session publishes: read from the GPU (NCCL) or a pinned host copy; a snapshot
        # when the publish runs in the background (stare.weight_sync.factory.build_publisher)
        self.publish_from = publish_from(cfg, cuda=self.device.type == "cuda")
        self.publish_snapshot = cfg.system.max_staleness >= 1
        self.policy = Policy(
            hidden=hidden_state_fn(self.engine, self.engine.module, self.device),
            lm_head=head.lm_head,
            device=self.device,
            chunk_tokens=o.logits_chunk_tokens,
            head=head,
        )
        # loss.ref_kl: the frozen base model, read in the pre-pass (learner/step/reference.py)
        self.reference = build_reference(
            cfg, model_path, policy=self.policy, policy_module=self.engine.module, ds_config=ds_config, dtype=dtype
        )
        # ln V bounds the target and band (a uniform distribution over the vocabulary)
        self.controller = EntropyController(cfg.controller, max_entropy=math.log(model.config.vocab_size))
        self.nonfinite_steps = 0  # steps whose loss or gradient norm was NaN or infinite (status, metrics)
        self.step = 0
        self.version = 0
        self.lagged_entropy: float | None = None
        self.prepared = PrepassStore()  # pre-pass values computed ahead of a step (`prepare`)
        self.rank_rows = RankRows(cfg, self.rank, self.world, self.rows, self.micro, pad_id, self.device)

    # -- one step -------------------------------------------------------------------------------

    def _collate(self, trajectories: list[Trajectory], kept: Mapping[str, torch.Tensor] | None = None) -> StepCut:
        """The step on the host (learner/step/step_rows.py); `kept`: pre-pass values of some of its trajectories."""
        return cut_step(trajectories, kept or {}, self.rank_rows)

    # -- the pre-pass ahead of a step ---------------------------------------------------------

    def prepare(self, trajectories: list[Trajectory]) -> None:
        """The pre-pass (old log-probs, entropy, predicted dH) of these whole groups at the current
        weights, kept on the host for the next step (one rank; several: `LeaderLearner.prepare`)."""
        self.prepared.keep(self.prepass_values(trajectories), self.version)

    def prepare_calls(self, trajectories: list[Trajectory]) -> list[int]:
        """The output-head calls of each micro-batch of `prepass_values` over these trajectories
        (host ints: rank 0 plans every rank's share, so that no prepare needs a collective of its own)."""
        return head_calls(
            self.rank_rows.plan(trajectories, range(len(trajectories))),
            trajectories,
            self.cfg.optim.logits_chunk_tokens,
        )

    @torch.no_grad()
    def prepass_values(
        self, trajectories: list[Trajectory], *, micro_batches: int = 0, min_chunks: Sequence[int] = ()
    ) -> dict[str, torch.Tensor]:
        """`prepass` over these whole groups (the advantages, for dH, are their groups' own) at the
        current weights, cut as a step cuts its rows: per trajectory id its [k, response length] values
        on the host. Several ranks: every rank calls it with its share; `micro_batches` is the ranks'
        common micro-batch count (fillers make up the difference) and, under ZeRO-3, `min_chunks` each
        micro-batch's head calls (`prepare_calls`' maximum over the ranks). One host read."""
        pack = self.rank_rows.pack
        plan = self.rank_rows.plan(trajectories, range(len(trajectories)))
        batch = collate(
            trajectories,
            pad_id=self.pad_id,
            rows=max(len(trajectories), 1),  # a rank may get none
            scale_by_std=self.cfg.data.advantage_std,
        )
        mbs = [build_micro_batch(g, batch.prompts, batch.responses, pad_id=self.pad_id, pack=pack) for g in plan]
        mbs += [filler_micro_batch(self.pad_id, pack=pack)] * (micro_batches - len(mbs))
        if min_chunks:
            mbs = [dataclasses.replace(mb, min_chunks=c) for mb, c in zip(mbs, min_chunks, strict=True)]
        self.engine.eval()
        try:
            values = self._prepass(mbs, batch.to(self.device))
        finally:
            self.engine.train()
        return to_host([values[k] for k in value_names(self.cfg)], trajectories)  # host sync: once per call

    def _prepass(self, mbs: list, batch) -> dict[str, torch.Tensor]:
        """The pre-pass's [S, L] buffers by name (`value_names`): old, ent, dh (zeros undiagnosed), ref."""
        diagnosed = self.cfg.diagnostics.predicted_entropy_change
        old, ent, dh = prepass(self.policy, mbs, batch, predicted_entropy_change=diagnosed)
        ref = reference_pass(self.reference, mbs, batch) if self.reference is not None else None
        return {"old": old, "ent": ent, "dh": dh, **({"ref": ref} if ref is not None else {})}

    # -- one step (continued) -----------------------------------------------------------------

    @property
    def needs_prepass(self) -> bool:
        """Whether the next step runs the pre-pass: always, but with STARE's selection keyed on the
        rollout's log-probs (loss.selection_keys rollout), once a step's entropy is there for the gate."""
        return not keys_from_rollout(self.cfg.loss) or self.lagged_entropy is None

    def _backward(self, loss: torch.Tensor, last: bool) -> None:
        ds.backward(self.engine, loss * self.world, last=last)  # DeepSpeed averages over ranks
        self.engine.step()

    def train_step(self, trajectories: list[Trajectory]) -> dict[str, Any]:
        cfg = self.cfg
        t0 = time.perf_counter()
        cut = self._collate(trajectories, self.prepared.get(trajectories, self.version))
        self.prepared.clear()  # this step moves the weights: nothing kept is valid after it
        updates, row_update = cut.updates, cut.row_update
        batch = cut.batch.to(self.device)
        all_mbs = [mb for mbs in updates for mb in mbs]
        prepassed = self.needs_prepass
        old: torch.Tensor | None = None
        ent0: torch.Tensor | None = None
        dh: torch.Tensor | None = None
        ref: torch.Tensor | None = None
        corr_sums: torch.Tensor | None = None
        if prepassed:
            self.engine.eval()
            buffers = self._prepass(cut.prepass, batch)
            self.engine.train()
            if cut.prepared is not None:  # the prepared rows' values, computed ahead at these weights: [k, K, L]
                rows, values = (to_device(t, self.device) for t in cut.prepared)
                for name, v in zip(value_names(cfg), values, strict=True):
                    buffers[name].index_copy_(0, rows, v.to(buffers[name].dtype))
            old, ent0, dh, ref = buffers["old"], buffers["ent"], buffers["dh"], buffers.get("ref")
            # rollout correction: IS weights and the masked tokens' removal, before anything counts tokens
            corr = rollout_correction(old, batch.rollout_logprobs, batch.mask, cfg.loss.rollout_correction)
            batch = dataclasses.replace(batch, mask=corr.keep, is_weight=corr.weight)
            corr_sums = corr.sums
        # the step's surprisal keys: the learner's pre-pass, or (loss.selection_keys rollout) the rollout's
        keys = batch.rollout_logprobs if keys_from_rollout(cfg.loss) or old is None else old
        step_entropy = ent0 if ent0 is not None else torch.zeros_like(keys)  # no pre-pass: no selection reads it
        tokens = gather_step_tokens(StepTokens(keys, step_entropy, batch.advantages, batch.token_uid, batch.mask))
        if ent0 is not None:
            h_step = mean_entropy(tokens.entropy, tokens.mask, cfg.loss.agg_mode)  # []
            h_prepass = float(h_step)  # host sync: once per step, before the first backward
        else:  # no pre-pass: the previous step's training-forward entropy (controller.entropy_source lagged)
            assert self.lagged_entropy is not None
            h_prepass = self.lagged_entropy
            h_step = torch.tensor(h_prepass, dtype=torch.float64, device=self.device)
        h_gate = (
            self.lagged_entropy
            if (self.controller.cfg.entropy_source == "lagged" and self.lagged_entropy is not None)
            else h_prepass
        )
        is_stare = isinstance(cfg.loss, StareLossConfig)  # the controller steers STARE only
        # once per batch, as the reference's trainer: gate, W and M hold for every update of the batch
        gate = self.controller.begin_step(h_gate, h_prepass) if is_stare else False  # order: reference updates W/M here
        w, m = (self.controller.w, self.controller.m) if is_stare else (1.0, 1.0)
        many = len(updates) > 1
        row_update = all_gather_cat(row_update.to(self.device)) if many else None  # [S] over every rank
        seed = cfg.run.seed * 1_000_003 + self.step
        results: list[dict[str, Any]] = []
        quadrants = torch.zeros(4, 5, dtype=torch.float64, device=self.device)
        t_plan = None
        for epoch in range(cfg.optim.epochs):
            for j, mbs in enumerate(updates):
                if not mbs:  # no rank has a row in this mini-batch (fewer groups than mini-batches)
                    continue
                ctx = plan_step(
                    update_tokens(tokens, row_update, j) if many else tokens,
                    cfg.loss,
                    gate=float(gate),
                    w=w,
                    m=m,
                    seed=seed + len(results) * SEED_STRIDE,
                )
                t_plan = t_plan or time.perf_counter()
                sums, q = train_pass(
                    self.policy,
                    mbs,
                    batch,
                    old,
                    ent0,
                    dh,
                    ctx,
                    cfg.loss,
                    h_step,
                    self._backward,
                    ref=ref,
                    correction=cfg.loss.rollout_correction,
                )
                if epoch == 0:
                    quadrants += q
                results.append(self._reduce_update(sums, ctx, epoch))
        self.step += 1
        self.version += 1
        t_end = time.perf_counter()

        step_metrics, totals = combine_updates(results, cfg.optim.epochs)
        pass_sums = [totals.pop(k) for k in CORRECTION_SUMS if k in totals]  # no pre-pass: train_pass's, reduced
        if corr_sums is None:  # the same collective either way (zeros here), so every rank's shapes agree
            corr_sums = torch.zeros(len(CORRECTION_SUMS), dtype=torch.float64, device=self.device)
        step_sums = all_reduce_sum(torch.cat([quadrants.reshape(-1), corr_sums]))  # [20 + 6]
        quadrants, corr_read = step_sums[: quadrants.numel()].view_as(quadrants), step_sums[quadrants.numel() :]
        train_tokens = totals.pop("train_tokens")  # over every rank
        self.lagged_entropy = totals.pop("train_entropy_sum") / max(train_tokens, 1.0)
        # no pre-pass: this step's entropy at its starting weights is its own training forward's (one update)
        h_now = h_prepass if prepassed else self.lagged_entropy
        if is_stare:
            self.controller.end_step(h_now)  # order: lagged updates W/M here
        metrics: dict[str, Any] = {
            "step": self.step,
            "weight_version": self.version,
            "loss": step_metrics.pop("loss"),
            "entropy": h_now,
            "entropy_gate_input": h_gate,
            "gate": int(gate),
            "controller_skipped": int(is_stare and self.controller.skipped),  # non-finite entropy: gate, W, M kept
            "w": self.controller.w if is_stare else 1.0,
            "m": self.controller.m if is_stare else 1.0,
            "target": self.controller.target,
            "band_low": self.controller.band[0] if self.controller.band else None,
            "band_high": self.controller.band[1] if self.controller.band else None,
            "clip_fraction": step_metrics.pop("clip_fraction"),
            "grad_norm": step_metrics.pop("grad_norm"),
            "train_tokens": train_tokens,
            "micro_batches": len(all_mbs),
            "prepass_micro_batches": len(cut.prepass) * prepassed,  # this rank's, fillers included (0: none ran)
            "prepared_rows": cut.prepared_rows,  # rows (every rank) whose pre-pass ran ahead of the step (`prepare`)
            "model_tokens": sum(mb.model_tokens for mb in all_mbs),
            "time_learn_s": t_end - t0,
            "time_plan_s": (t_plan or t_end) - t0,
        }
        self.nonfinite_steps += nonfinite_step(metrics["loss"], metrics["grad_norm"], self.step)
        metrics["nonfinite_steps"] = self.nonfinite_steps
        if (scale := ds.loss_scale(self.engine)) is not None:  # fp16
            metrics.update(loss_scale=scale, skipped_steps=int(self.engine.skipped_steps))
        metrics["rollout_logprob_gap"] = totals.pop("rollout_logprob_gap_sum") / max(train_tokens, 1.0)
        metrics.update(totals)
        metrics.update(step_metrics)
        quadrant_values = quadrant_metrics(quadrants)
        read = torch.cat([torch.stack(list(quadrant_values.values())), corr_read]).tolist()  # host sync
        metrics.update(dict(zip(quadrant_values, read)))
        metrics.update(correction_metrics(pass_sums or read[len(quadrant_values) :]))
        metrics["prepass"] = int(prepassed)  # loss.selection_keys rollout: 0 once an entropy is lagged
        return metrics

    def _reduce_update(self, sums: dict[str, torch.Tensor], ctx, epoch: int) -> dict[str, Any]:
        """An update's metric sums over every rank, read once (its host syncs: the sums, its token
        count and DeepSpeed's gradient norm of the update)."""
        names = sorted(sums)
        reduced = all_reduce_sum(torch.stack([sums[k] for k in names]))
        return {
            "epoch": epoch,
            "totals": dict(zip(names, reduced.tolist())),  # host sync: the update's sums
            "n_tokens": float(ctx.norm.num_tokens),  # host sync: the update's token count
            "grad_norm": ds.grad_norm(self.engine),
        }  # host sync: DeepSpeed's norm of the update

    # -- weights and checkpoints --------------------------------------------------------------

    def weights_are_collective(self) -> bool:
        """Whether gathering the weights needs every rank (ZeRO-3 over several ranks)."""
        return self.world > 1 and self.engine.zero_optimization_stage() == 3

    def state_dict_for_rollout(self) -> Mapping[str, torch.Tensor]:
        """The whole model on rank 0 (what the rollout engines load), on the GPU or in host memory
        (`system.weight_sync_publish_from`); other ranks only take part in the ZeRO-3 gathers and get {}.
        With LoRA: the merged weights, named as the base model (ZeRO 0-2: whole on every rank)."""
        if self.lora is not None:
            from learner.engine.lora import merged_state_dict

            return merged_state_dict(self.engine.module, self.publish_from) if self.rank == 0 else {}
        return ds.full_state_dict(
            self.engine, keep=self.rank == 0, where=self.publish_from, snapshot=self.publish_snapshot
        )

    def weights_for_local_engine(self, keep: bool = True) -> Mapping[str, torch.Tensor]:
        """The whole model on THIS rank, for a rollout engine in this process (the node-colocated learner):
        unlike `state_dict_for_rollout`, every rank keeps it. ZeRO-3: each parameter gathered (a collective:
        every rank calls this at the same point; `keep=False` takes part and keeps nothing); ZeRO 0-2: local.
        On the learner's device (ZeRO 0-2: the parameters themselves, read before the learner steps again;
        ZeRO-3: one copy) unless `system.weight_sync_publish_from` is host (pinned host copies). With LoRA:
        the merged weights."""
        where = "host" if self.cfg.system.weight_sync_publish_from == "host" else "device"
        if self.lora is not None:
            from learner.engine.lora import merged_state_dict

            return merged_state_dict(self.engine.module, where) if keep else {}
        return ds.full_state_dict(self.engine, keep=keep, where=where, snapshot=False)

    def save(self, directory: Path, extra: dict[str, Any]) -> str:
        """A checkpoint under directory/step_N, `latest` pointed at it last (learner/step/learner_checkpoint.py)."""
        return learner_checkpoint.save(self, directory, extra)

    def load(self, directory: Path, tag: str | None = None) -> dict[str, Any]:
        """Checkpoint `tag` (None: the newest that verifies; learner/step/learner_checkpoint.py)."""
        return learner_checkpoint.load(self, directory, tag)
