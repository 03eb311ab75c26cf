"""The two passes of a learner step over its micro-batches, on the policy's device.

    prepass:    no grad; old log-probs, entropy and (optionally) the predicted entropy change of
                every response token, into [S, L] buffers
    train_pass: per micro-batch forward, policy loss, backward; metric sums accumulated as tensors
                (without a pre-pass, loss.selection_keys rollout: the old log-probs, the step's entropy and
                the rollout correction come from each micro-batch's own forward)

Device discipline: the step tensors arrive on `policy.device` (`TrainBatch.to`), each micro-batch
is moved there once (`MicroBatch.to`: pinned, non-blocking on CUDA), and every buffer and
accumulator is allocated there. Neither pass reads a value back to the host: the host syncs of a
step are the trainer's (docs/algorithm.md, "Host syncs").
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from learner.algorithm.losses import LossInputs, StepContext, policy_loss
from learner.algorithm.quadrants import quadrant_sums
from learner.algorithm.rollout_correction import METRIC_SUMS, rollout_correction
from learner.step.batch import TrainBatch
from learner.step.logprobs import ChunkedHead, chunked_logprobs_and_entropy
from learner.step.micro_batches import MicroBatch
from stare.config.algo import RolloutCorrectionConfig, SurrogateConfig
from stare.config.train import keys_from_rollout

METRIC_NAMES = ("loss", "train_entropy_sum", "rollout_logprob_gap_sum", "train_tokens")
CORRECTION_SUMS = tuple(f"rollout_correction_{k}" for k in METRIC_SUMS)  # train_pass's, without a pre-pass


@dataclass(frozen=True)
class Policy:
    """What the passes need of the model: its last hidden states, its output head, its device.
    `head`: the learner's `ChunkedHead` (one module call per micro-batch: ZeRO-3 gathers the head
    once); without it the chunks call `lm_head` directly."""

    hidden: Callable[[MicroBatch], Tensor]  # micro-batch (on device) -> [R, T, H] last hidden state
    lm_head: nn.Module  # [*, H] -> [*, V]
    device: torch.device
    chunk_tokens: int  # positions per log-softmax chunk (optim.logits_chunk_tokens)
    head: ChunkedHead | None = None


@contextmanager
def without_head(model: nn.Module) -> Iterator[None]:
    """The causal LM's output head replaced by an identity for the duration: its forward runs the
    decoder only (under ZeRO-3 the head's module hooks, which gather its weight, never fire; its
    weight is gathered once per micro-batch by `ChunkedHead` instead). Only the learner's own thread
    calls its model, so nothing sees the model without its head."""
    head = model.get_output_embeddings()
    model.set_output_embeddings(nn.Identity())
    try:
        yield
    finally:
        model.set_output_embeddings(head)


def hidden_state_fn(forward: Callable, model: nn.Module, device: torch.device) -> Callable[[MicroBatch], Tensor]:
    """micro-batch -> [R, T, H] last hidden state of a transformers causal LM, through `forward` (the
    DeepSpeed engine, so ZeRO-3 hooks and its bookkeeping run as for any forward, or the model
    itself), the decoder without the head (`without_head`; `logits_to_keep` an empty index too): a
    forward hook on the decoder hands back its last hidden state. Every forward calls the same
    modules in the same order, so DeepSpeed's ZeRO-3 prefetch trace stays valid across micro-batches."""
    taken: list[Tensor] = []
    model.get_decoder().register_forward_hook(lambda _m, _args, out: taken.append(out.last_hidden_state))
    none = torch.zeros(0, dtype=torch.long, device=device)

    def hidden(mb: MicroBatch) -> Tensor:  # [R, T, H]
        with without_head(model):
            forward(
                input_ids=mb.input_ids,
                attention_mask=mb.attention_mask,
                position_ids=mb.position_ids,
                use_cache=False,
                logits_to_keep=none,
            )
        return taken.pop()

    return hidden


def response_stats(
    policy: Policy,
    mb: MicroBatch,  # on policy.device
    advantages: Tensor | None = None,  # [B, length]: also the predicted entropy change (no grad)
) -> tuple[Tensor, Tensor, Tensor | None]:  # logp [B, length], entropy [B, length], dH [B, length] | None
    """Log-prob and entropy of each response token of the micro-batch, in the loss's row layout."""
    hidden = policy.hidden(mb)  # [R, T, H]
    h = hidden.reshape(-1, hidden.shape[-1]).index_select(0, mb.pred_index)  # [N, H]
    adv = None if advantages is None else advantages.reshape(-1).index_select(0, mb.token_index)  # [N]
    if policy.head is not None:  # one module call: under ZeRO-3 one gather of the head
        logp, entropy, dh = policy.head(h, mb.targets, adv, mb.min_chunks)
    else:
        logp, entropy, dh = chunked_logprobs_and_entropy(
            policy.lm_head, h, mb.targets, chunk_tokens=policy.chunk_tokens, advantages=adv, min_chunks=mb.min_chunks
        )
    B = mb.rows.shape[0]

    def to_rows(v: Tensor) -> Tensor:  # [N] -> [B, length], zero where a row is shorter
        return v.new_zeros(B * mb.length).index_copy(0, mb.token_index, v).view(B, mb.length)

    return to_rows(logp), to_rows(entropy), None if dh is None else to_rows(dh)


def _rows(t: Tensor, mb: MicroBatch) -> Tensor:  # [S, L] -> [B, length]
    return t.index_select(0, mb.rows)[:, : mb.length]


@torch.no_grad()
def prepass(
    policy: Policy,
    micro_batches: list[MicroBatch],  # on the host
    step: TrainBatch,  # on policy.device
    *,
    predicted_entropy_change: bool,
) -> tuple[Tensor, Tensor, Tensor]:  # old log-probs, entropy, predicted dH: each [S, L] on policy.device
    """The step's starting log-probs and entropy (and the diagnostics' dH, fused into the same chunks)."""
    S, L = step.mask.shape
    dtype = torch.promote_types(next(policy.lm_head.parameters()).dtype, torch.float32)  # the chunks' dtype
    old, ent, dh = (torch.zeros(S, L, dtype=dtype, device=policy.device) for _ in range(3))
    for host_mb in micro_batches:
        if host_mb.filler:
            response_stats(policy, host_mb.to(policy.device))  # same collectives as the other ranks (ZeRO-3)
            continue
        mb = host_mb.to(policy.device)
        adv = _rows(step.advantages, mb) if predicted_entropy_change else None
        logp, entropy, change = response_stats(policy, mb, adv)  # [B, length] each
        n = mb.length
        old[mb.rows, :n], ent[mb.rows, :n] = logp, entropy
        if change is not None:
            dh[mb.rows, :n] = change
    return old, ent, dh


def train_pass(
    policy: Policy,
    micro_batches: list[MicroBatch],  # on the host
    step: TrainBatch,  # on policy.device
    old: Tensor | None,  # [S, L]; None: no pre-pass ran (each micro-batch's own forward, detached)
    ent0: Tensor | None,  # [S, L]; None: as old
    dh: Tensor | None,  # [S, L]; None: zeros
    ctx: StepContext,
    loss_cfg: SurrogateConfig,
    h_step: Tensor,  # [] the step's batch entropy (quadrant split)
    backward: Callable[[Tensor, bool], None],  # (micro-batch loss, is the last micro-batch)
    ref: Tensor | None = None,  # [S, L] the reference's log-probs (loss.ref_kl: learner/step/reference.py)
    correction: RolloutCorrectionConfig | None = None,  # with old None: the rollout correction, per micro-batch
) -> tuple[dict[str, Tensor], Tensor]:  # metric sums (each [] float64), quadrant sums [4, 5] float64
    """Forward, loss and backward of every micro-batch; metrics summed on policy.device, never read.

    Without a pre-pass (`old` None: one update a batch, so this forward runs at the step's starting
    weights, as the pre-pass would) the old log-probs are the forward's own, detached (the ratio is 1
    with its gradient), and the rollout correction's IS weights and mismatch sums (`CORRECTION_SUMS`)
    are computed here: each row's depend on that row only, so per micro-batch is the same as per step."""
    dev = policy.device
    rollout_keys = keys_from_rollout(loss_cfg)
    names = METRIC_NAMES + (CORRECTION_SUMS if old is None else ())
    sums: dict[str, Tensor] = {k: torch.zeros((), dtype=torch.float64, device=dev) for k in names}
    quadrants = torch.zeros(4, 5, dtype=torch.float64, device=dev)
    for i, host_mb in enumerate(micro_batches):
        mb = host_mb.to(dev)
        logprobs, entropy, _ = response_stats(policy, mb)  # [B, length] each
        mask = _rows(step.mask, mb)
        if mb.filler:  # host flag: a stand-in trains no token
            mask = torch.zeros_like(mask)
        adv, rollout_mb = _rows(step.advantages, mb), _rows(step.rollout_logprobs, mb)
        is_weight = None if step.is_weight is None else _rows(step.is_weight, mb)
        if old is None:
            old_mb = logprobs.detach()
            corr = rollout_correction(old_mb, rollout_mb, mask, correction or RolloutCorrectionConfig())
            is_weight = corr.weight
            for k, v in zip(CORRECTION_SUMS, corr.sums, strict=True):
                sums[k] += v
        else:
            old_mb = _rows(old, mb)
        x = LossInputs(
            logprobs=logprobs,
            old_logprobs=old_mb,
            advantages=adv,
            mask=mask,
            token_uid=_rows(step.token_uid, mb),
            entropy=entropy,
            step_entropy=entropy.detach() if ent0 is None else _rows(ent0, mb),
            rollout_logprobs=rollout_mb,
            is_weight=is_weight,
            ref_logprobs=None if ref is None else _rows(ref, mb),
            selection_logprobs=rollout_mb if rollout_keys else None,
        )
        out = policy_loss(x, ctx, loss_cfg)
        backward(out.loss, i == len(micro_batches) - 1)
        sums["loss"] += out.loss.detach().double()
        sums["train_entropy_sum"] += (entropy.detach() * mask).sum().double()
        sums["train_tokens"] += mask.sum().double()
        # learner vs rollout-engine log-prob mismatch (what TIS corrects)
        sums["rollout_logprob_gap_sum"] += ((old_mb - x.rollout_logprobs).abs() * mask).sum().double()
        for k, v in out.metrics.items():
            if k not in sums:
                sums[k] = torch.zeros((), dtype=torch.float64, device=dev)
            sums[k] += v.detach().double()
        dh_mb = torch.zeros_like(old_mb) if dh is None else _rows(dh, mb)
        quadrants += quadrant_sums(adv.double(), -old_mb.double(), mask, h_step.double(), dh_mb.double())
    return sums, quadrants
