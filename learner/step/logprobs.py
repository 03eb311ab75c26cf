"""Log-probs and entropy of response tokens, computed in chunks of tokens from hidden states.

The model's last hidden state at each position that predicts a response token is gathered first
([N, H], N = the micro-batch's response tokens: prompt and padding positions never meet the
vocabulary), then `lm_head` runs on `chunk_tokens` rows at a time and each chunk's logits are
upcast to fp32, reduced to (log-prob of the sampled token, entropy) and dropped. The largest
vocabulary-sized tensor is [chunk_tokens, V] fp32; no [B, L, V] tensor exists. Under autograd each
chunk keeps only its inputs (hidden rows, targets, two [C] statistics) and recomputes its logits
in the backward, one chunk at a time: a hand-written backward (`_FusedChunk`) for a plain linear
head whose weight is materialised, a non-reentrant activation checkpoint of the module call otherwise.

`ChunkedHead` is the learner's way in: one module call per micro-batch runs every chunk. Under
ZeRO-3 the head's weight is registered as that module's external parameter, so DeepSpeed gathers it
once in the module's forward and once in its backward (not once per chunk and again per recompute,
1.09 GB each time at 7B), the chunks take the fused path on the gathered weight, and the module call
sequence DeepSpeed traces for prefetching is the same for every micro-batch whatever its chunk count.

Equal to the unchunked `log_softmax` over full logits up to float reassociation (tests: 1e-6,
gradients too). The optional predicted entropy change (`learner.algorithm.quadrants`) is computed
from the same chunk's log-softmax in the no-grad pre-pass, so the diagnostics cost no extra pass.
"""

from __future__ import annotations

from functools import partial

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from learner.algorithm.quadrants import predicted_entropy_change


def _chunk_stats(
    lm_head,  # a module, or [C, H] -> [C, V] on a materialised weight (`_linear`)
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


def _linear(weight: Tensor, hidden: Tensor) -> Tensor:  # [V, H], [C, H] -> [C, V]
    return torch.nn.functional.linear(hidden, weight)


def _fusable(lm_head: nn.Module) -> bool:
    """A plain bias-free linear head whose weight is materialised: a whole tensor, or a ZeRO-3
    partition while it is gathered (inside `ChunkedHead`'s forward). A partitioned head called on
    its own gathers in its module hooks: that one runs the checkpointed module path."""
    if not (isinstance(lm_head, nn.Linear) and lm_head.bias is None):
        return False
    w = lm_head.weight
    return w.numel() > 0 and w.numel() == getattr(w, "ds_numel", w.numel())


class ChunkedHead(nn.Module):
    """`chunked_logprobs_and_entropy` of one micro-batch as one module call (see the module docstring).

    Holds the output head by reference, not as a submodule: the head's weight keeps its one name in
    the state dict, and this module has no parameter of its own (attaching it to the model adds no
    checkpoint key). Under ZeRO-3 the head's weight must be registered as this module's external
    parameter before `deepspeed.initialize` (learner.engine.deepspeed_engine.build_engine does)."""

    def __init__(self, lm_head: nn.Module, chunk_tokens: int):
        super().__init__()
        object.__setattr__(self, "lm_head", lm_head)  # not registered: no second name for its weight
        self.chunk_tokens = chunk_tokens

    @property
    def weight(self) -> nn.Parameter:
        return self.lm_head.weight

    def forward(
        self,
        hidden: Tensor,  # [N, H]
        targets: Tensor,  # [N] long
        advantages: Tensor | None = None,  # [N]
        min_chunks: int = 1,
    ) -> tuple[Tensor, Tensor, Tensor | None]:  # logp [N], entropy [N], predicted dH [N] | None
        return chunked_logprobs_and_entropy(
            self.lm_head, hidden, targets, chunk_tokens=self.chunk_tokens, advantages=advantages, min_chunks=min_chunks
        )


def attach_chunked_head(model: nn.Module, chunk_tokens: int) -> ChunkedHead:
    """A `ChunkedHead` over the model's output head, attached as the submodule `stare_head` (so that
    DeepSpeed registers its hooks on it; it holds no parameter)."""
    head = ChunkedHead(model.get_output_embeddings(), chunk_tokens)
    model.add_module("stare_head", head)
    return head


def chunked_logprobs_and_entropy(
    lm_head: nn.Module,
    hidden: Tensor,  # [N, H] last hidden state at each position that predicts a response token
    targets: Tensor,  # [N] long, the response tokens
    *,
    chunk_tokens: int,
    advantages: Tensor | None = None,  # [N]: also return the predicted entropy change (no-grad only)
    min_chunks: int = 1,
) -> tuple[
    Tensor, Tensor, Tensor | None
]:  # logp [N], entropy [N] (fp32, fp64 for fp64 models), predicted dH [N] | None
    """log pi(target) and the entropy of each position's next-token distribution, `chunk_tokens`
    positions at a time (N is a host int: the loop has no host sync). At least `min_chunks` head
    calls (the extra ones on no rows): under ZeRO-3 each call of a partitioned head gathers its
    weight, a collective, so every rank must make as many as the others."""
    if chunk_tokens < 1:
        raise ValueError(f"optim.logits_chunk_tokens must be >= 1, got {chunk_tokens}")
    grad = torch.is_grad_enabled() and hidden.requires_grad
    if grad and advantages is not None:
        raise ValueError("the predicted entropy change is a no-grad diagnostic: compute it in the pre-pass")
    fusable = _fusable(lm_head)
    logps, entropies, dhs = [], [], []
    n_chunks = max(-(-hidden.shape[0] // chunk_tokens), min_chunks)
    for start in range(0, n_chunks * chunk_tokens, chunk_tokens):
        h, t = hidden[start : start + chunk_tokens], targets[start : start + chunk_tokens]  # [C, H], [C]
        a = None if advantages is None else advantages[start : start + chunk_tokens]
        if grad and fusable:
            logp, entropy = _FusedChunk.apply(h, lm_head.weight, t)
            dh = None
        elif grad:
            logp, entropy, dh = checkpoint(_chunk_stats, lm_head, h, t, None, use_reentrant=False)
        else:  # a materialised weight directly: no module call (under ZeRO-3 its hooks would release it)
            logp, entropy, dh = _chunk_stats(partial(_linear, lm_head.weight) if fusable else lm_head, h, t, a)
        logps.append(logp)
        entropies.append(entropy)
        dhs.append(dh)
    if not logps:  # no response tokens and no head call asked for
        empty = hidden.new_zeros(0, dtype=torch.float32)
        return empty, empty, (empty if advantages is not None else None)
    dh = torch.cat(dhs) if advantages is not None else None
    return torch.cat(logps), torch.cat(entropies), dh
