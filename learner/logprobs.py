"""Log-probs and entropy of response tokens, computed in chunks of tokens from hidden states.

The model's last hidden state at each position that predicts a response token is gathered first
([N, H], N = the micro-batch's response tokens: prompt and padding positions never meet the
vocabulary), then `lm_head` runs on `chunk_tokens` rows at a time and each chunk's logits are
upcast to fp32, reduced to (log-prob of the sampled token, entropy) and dropped. The largest
vocabulary-sized tensor is [chunk_tokens, V] fp32; no [B, L, V] tensor exists. Under autograd each
chunk runs inside a non-reentrant activation checkpoint, so the backward keeps only the chunk's
inputs (hidden rows, targets) and recomputes its logits, one chunk at a time.

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
    logp_full = torch.log_softmax(logits.to(torch.promote_types(logits.dtype, torch.float32)), -1)  # [C, V] >= fp32
    logp = logp_full.gather(-1, targets[:, None]).squeeze(-1)  # [C]
    entropy = -(logp_full.exp() * logp_full).sum(-1)  # [C]
    dh = None
    if advantages is not None:
        dh = predicted_entropy_change(logp_full[None], targets[None], advantages[None].to(logp_full.dtype))[0]  # [C]
    return logp, entropy, dh


def chunked_logprobs_and_entropy(
    lm_head: nn.Module,
    hidden: Tensor,  # [N, H] last hidden state at each position that predicts a response token
    targets: Tensor,  # [N] long, the response tokens
    *,
    chunk_tokens: int,
    advantages: Tensor | None = None,  # [N]: also return the predicted entropy change (no-grad only)
) -> tuple[Tensor, Tensor, Tensor | None]:  # logp [N], entropy [N] (fp32, fp64 for fp64 models), predicted dH [N] | None
    """log pi(target) and the entropy of each position's next-token distribution, `chunk_tokens`
    positions at a time (N is a host int: the loop has no host sync)."""
    if chunk_tokens < 1:
        raise ValueError(f"optim.logits_chunk_tokens must be >= 1, got {chunk_tokens}")
    grad = torch.is_grad_enabled() and hidden.requires_grad
    if grad and advantages is not None:
        raise ValueError("the predicted entropy change is a no-grad diagnostic: compute it in the pre-pass")
    logps, entropies, dhs = [], [], []
    for start in range(0, hidden.shape[0], chunk_tokens):
        h, t = hidden[start : start + chunk_tokens], targets[start : start + chunk_tokens]  # [C, H], [C]
        a = None if advantages is None else advantages[start : start + chunk_tokens]
        if grad:
            logp, entropy, dh = checkpoint(_chunk_stats, lm_head, h, t, None, use_reentrant=False)
        else:
            logp, entropy, dh = _chunk_stats(lm_head, h, t, a)
        logps.append(logp)
        entropies.append(entropy)
        dhs.append(dh)
    if not logps:  # no response tokens
        empty = hidden.new_zeros(0, dtype=torch.float32)
        return empty, empty, (empty if advantages is not None else None)
    dh = torch.cat(dhs) if advantages is not None else None
    return torch.cat(logps), torch.cat(entropies), dh
