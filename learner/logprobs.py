"""Log-probs and entropy of response tokens, computed in chunks of tokens from hidden states.

The model's last hidden state at each position that predicts a response token is gathered first
([N, H], N = the micro-batch's response tokens: prompt and padding positions never meet the
vocabulary), then `lm_head` runs on `chunk_tokens` rows at a time and each chunk's logits are
upcast to fp32, reduced to (log-prob of the sampled token, entropy) and dropped. The largest
vocabulary-sized tensor is [chunk_tokens, V] fp32; no [B, L, V] tensor exists. Under autograd each
chunk keeps only its inputs (hidden rows, targets, two [C] statistics) and recomputes its logits
in the backward, one chunk at a time: a hand-written backward (`_FusedChunk`) for a plain linear
head, a non-reentrant activation checkpoint of the module call otherwise (a ZeRO-3 partitioned
head, whose weight only exists inside its forward hooks).

Equal to the unchunked `log_softmax` over full logits up to float reassociation (tests: 1e-6,
gradients too). The optional predicted entropy change (`stare.learner.diagnostics`) is computed
from the same chunk's log-softmax in the no-grad pre-pass, so the diagnostics cost no extra pass.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from stare.learner.diagnostics import predicted_entropy_change


def _chunk_stats(
    lm_head: nn.Module,
    hidden: Tensor,  # [C, H]
    targets: Tensor,  # [C] long
    advantages: Tensor | None,  # [C] or None
) -> tuple[Tensor, Tensor, Tensor | None]:  # logp [C], entropy [C], predicted dH [C] | None
    logits = lm_head(hidden)  # [C, V] in the model's dtype
    logp_full = torch.log_softmax(_upcast(logits), -1)  # [C, V] >= fp32
    if torch.is_grad_enabled():  # the checkpointed path: autograd needs out-of-place ops
        entropy = -(logp_full.exp() * logp_full).sum(-1)  # [C]
    else:  # the pre-pass: the logits freed first, so two [C, V] tensors at most
        del logits
        entropy = -logp_full.exp().mul_(logp_full).sum(-1)  # [C]
    logp = logp_full.gather(-1, targets[:, None]).squeeze(-1)  # [C]
    dh = None
    if advantages is not None:
        dh = predicted_entropy_change(logp_full[None], targets[None], advantages[None].to(logp_full.dtype))[0]  # [C]
    return logp, entropy, dh


class _FusedChunk(torch.autograd.Function):
    """log pi(target) and entropy of one chunk with a hand-written backward: the forward keeps only
    (hidden, targets, entropy, logsumexp); the backward recomputes the chunk's logits once and forms
    d logits = g_logp (onehot - p) - g_H p (log p + H) in place, then the two matmuls of the linear
    head. No autograd graph over [C, V] tensors, and at most two [C, V] fp32 tensors alive at once
    in either pass (forward: log p and p, the logits freed first; backward: the logits, turned into
    log p and then into d logits in place, and p): fewer vocabulary-sized passes and allocations
    than autograd's log_softmax/exp/mul/sum and its backward."""

    @staticmethod
    def forward(ctx, hidden: Tensor, weight: Tensor, targets: Tensor):  # [C, H], [V, H], [C]
        z = _upcast(torch.nn.functional.linear(hidden, weight))  # [C, V] >= fp32
        logp_full = torch.log_softmax(z, -1)  # [C, V]
        logp = logp_full.gather(-1, targets[:, None]).squeeze(-1)  # [C]
        lse = z.gather(-1, targets[:, None]).squeeze(-1) - logp  # [C] logsumexp of the logits, for free
        del z  # before p: two [C, V] tensors at most
        p = logp_full.exp()  # [C, V]
        entropy = -p.mul_(logp_full).sum(-1)  # [C]
        ctx.save_for_backward(hidden, weight, targets, entropy, lse)
        return logp, entropy

    @staticmethod
    def backward(ctx, g_logp: Tensor, g_entropy: Tensor):  # [C], [C]
        hidden, weight, targets, entropy, lse = ctx.saved_tensors
        logits = torch.nn.functional.linear(hidden, weight)  # [C, V], recomputed
        dtype = logits.dtype
        logp = _upcast(logits).sub_(lse[:, None])  # [C, V] log p (in place on the fp32 logits)
        del logits
        p = logp.exp()  # [C, V]
        # dH/dz_j = -p_j (log p_j + H); d logp_t/dz_j = [j = t] - p_j; so
        # dz_j = p_j (-g_logp - g_H H - g_H log p_j) + g_logp [j = t], formed in log p's buffer
        d = torch.addcmul((-g_logp - g_entropy * entropy)[:, None], logp, -g_entropy[:, None], out=logp).mul_(p)
        del p
        d.scatter_add_(-1, targets[:, None], g_logp[:, None])
        d = d.to(dtype)
        grad_hidden = d @ weight if ctx.needs_input_grad[0] else None  # [C, H]
        grad_weight = d.t() @ hidden if ctx.needs_input_grad[1] else None  # [V, H]
        return grad_hidden, grad_weight, None


def _upcast(logits: Tensor) -> Tensor:
    """The logits in at least fp32: the tensor itself when it already is (callers own it and may
    write to it), else a new fp32 copy."""
    return logits.to(torch.promote_types(logits.dtype, torch.float32))


def _fusable(lm_head: nn.Module) -> bool:
    """A plain bias-free linear head whose weight is materialised (not a ZeRO-3 partition, whose
    gather happens in the module's forward hooks: that one runs the checkpointed module path)."""
    return (isinstance(lm_head, nn.Linear) and lm_head.bias is None
            and not hasattr(lm_head.weight, "ds_id"))


def chunked_logprobs_and_entropy(
    lm_head: nn.Module,
    hidden: Tensor,  # [N, H] last hidden state at each position that predicts a response token
    targets: Tensor,  # [N] long, the response tokens
    *,
    chunk_tokens: int,
    advantages: Tensor | None = None,  # [N]: also return the predicted entropy change (no-grad only)
    min_chunks: int = 1,
) -> tuple[Tensor, Tensor, Tensor | None]:  # logp [N], entropy [N] (fp32, fp64 for fp64 models), predicted dH [N] | None
    """log pi(target) and the entropy of each position's next-token distribution, `chunk_tokens`
    positions at a time (N is a host int: the loop has no host sync). At least `min_chunks` head
    calls (the extra ones on no rows): under ZeRO-3 each call of a partitioned head gathers its
    weight, a collective, so every rank must make as many as the others."""
    if chunk_tokens < 1:
        raise ValueError(f"optim.logits_chunk_tokens must be >= 1, got {chunk_tokens}")
    grad = torch.is_grad_enabled() and hidden.requires_grad
    if grad and advantages is not None:
        raise ValueError("the predicted entropy change is a no-grad diagnostic: compute it in the pre-pass")
    logps, entropies, dhs = [], [], []
    n_chunks = max(-(-hidden.shape[0] // chunk_tokens), min_chunks)
    for start in range(0, n_chunks * chunk_tokens, chunk_tokens):
        h, t = hidden[start : start + chunk_tokens], targets[start : start + chunk_tokens]  # [C, H], [C]
        a = None if advantages is None else advantages[start : start + chunk_tokens]
        if grad and _fusable(lm_head):
            logp, entropy = _FusedChunk.apply(h, lm_head.weight, t)
            dh = None
        elif grad:
            logp, entropy, dh = checkpoint(_chunk_stats, lm_head, h, t, None, use_reentrant=False)
        else:
            logp, entropy, dh = _chunk_stats(lm_head, h, t, a)
        logps.append(logp)
        entropies.append(entropy)
        dhs.append(dh)
    if not logps:  # no response tokens and no head call asked for
        empty = hidden.new_zeros(0, dtype=torch.float32)
        return empty, empty, (empty if advantages is not None else None)
    dh = torch.cat(dhs) if advantages is not None else None
    return torch.cat(logps), torch.cat(entropies), dh
