"""Four-quadrant diagnostics: advantage sign x surprisal above/below the batch entropy.

Per micro-batch these return *sums* ([4, k] tensors, quadrants in the order of `QUADRANTS`), so the
learner adds them over micro-batches and ranks and turns them into fractions and means once per
step with `quadrant_metrics`. Tokens with zero advantage belong to no quadrant.

`predicted_entropy_change` is the first-order change of each next-token distribution's entropy
under one policy-gradient step on its sampled token (DESIGN.md section 1):

    dH = eta * A * [pi_a (s_a - H) - sum_k pi_k^2 (s_k - H)],   s_k = -log pi_k,

which needs the full-vocabulary log-probs.
"""

from __future__ import annotations

import torch
from torch import Tensor

QUADRANTS = ("pos_high", "pos_low", "neg_high", "neg_low")  # advantage sign x surprisal vs entropy


def quadrant_masks(
    advantages: Tensor,  # [B, L]
    surprisal: Tensor,  # [B, L]
    mask: Tensor,  # [B, L] bool
    batch_entropy: Tensor,  # [] H_bar
) -> Tensor:  # [4, B, L] bool
    high = surprisal > batch_entropy
    pos, neg = mask & (advantages > 0), mask & (advantages < 0)
    return torch.stack([pos & high, pos & ~high, neg & high, neg & ~high])


def quadrant_sums(
    advantages: Tensor,  # [B, L]
    surprisal: Tensor,  # [B, L]
    mask: Tensor,  # [B, L] bool
    batch_entropy: Tensor,  # []
    predicted_dh: Tensor | None = None,  # [B, L] from predicted_entropy_change
) -> Tensor:  # [4, 5]: tokens, sum A, sum s, sum predicted dH, all tokens in the batch
    q = quadrant_masks(advantages, surprisal, mask, batch_entropy).to(advantages.dtype)  # [4, B, L]
    dh = torch.zeros_like(advantages) if predicted_dh is None else predicted_dh
    total = mask.sum().to(advantages.dtype).expand(4)
    return torch.stack(
        [q.sum((1, 2)), (q * advantages).sum((1, 2)), (q * surprisal).sum((1, 2)), (q * dh).sum((1, 2)), total],
        dim=1,
    )


def quadrant_metrics(sums: Tensor) -> dict[str, Tensor]:
    """Step-level token fraction, mean advantage, mean surprisal and summed predicted dH per quadrant."""
    tokens, adv, surprisal, dh, total = sums.unbind(1)
    out: dict[str, Tensor] = {}
    for i, name in enumerate(QUADRANTS):
        n = tokens[i].clamp(min=1)
        out[f"quadrant/{name}/fraction"] = tokens[i] / total[i].clamp(min=1)
        out[f"quadrant/{name}/mean_advantage"] = adv[i] / n
        out[f"quadrant/{name}/mean_surprisal"] = surprisal[i] / n
        out[f"quadrant/{name}/predicted_dH"] = dh[i]
    return out


def predicted_entropy_change(
    full_logprobs: Tensor,  # [B, L, V] log pi over the vocabulary, detached
    tokens: Tensor,  # [B, L] sampled token ids
    advantages: Tensor,  # [B, L]
    eta: float = 1.0,  # step size in logit space
) -> Tensor:  # [B, L]
    """First-order entropy change of each position's distribution after the logit step eta A (e_a - pi)."""
    pi = full_logprobs.exp()  # [B, L, V]
    s = -full_logprobs  # [B, L, V]
    entropy = (pi * s).sum(-1, keepdim=True)  # [B, L, 1]
    pi_a = pi.gather(-1, tokens[..., None]).squeeze(-1)  # [B, L]
    s_a = s.gather(-1, tokens[..., None]).squeeze(-1)  # [B, L]
    spread = (pi * pi * (s - entropy)).sum(-1)  # [B, L]
    return eta * advantages * (pi_a * (s_a - entropy.squeeze(-1)) - spread)
