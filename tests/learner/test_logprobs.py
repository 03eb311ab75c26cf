"""Chunked log-probs and entropy equal the full-vocabulary computation, values and gradients, and keep
no vocabulary-sized activation for the backward."""

import pytest
import torch
from learner_helpers import random_qwen2, trajectories

from learner.algorithm.quadrants import predicted_entropy_change
from learner.step.batch import collate, token_logprobs_and_entropy
from learner.step.forward_passes import Policy, hidden_state_fn, response_stats
from learner.step.logprobs import ChunkedHead, chunked_logprobs_and_entropy
from learner.step.micro_batches import build_micro_batch


def _full(lm_head, hidden, targets):  # the unchunked reference: [N, V] log-softmax at once
    logits = lm_head(hidden)
    logp_full = torch.log_softmax(logits.to(torch.promote_types(logits.dtype, torch.float32)), -1)  # [N, V]
    return logp_full.gather(-1, targets[:, None]).squeeze(-1), -(logp_full.exp() * logp_full).sum(-1), logp_full


def _case(dtype, n=37, h=16, v=1000, seed=0):
    g = torch.Generator().manual_seed(seed)
    head = torch.nn.Linear(h, v, bias=False).to(dtype)
    with torch.no_grad():
        head.weight.copy_(torch.randn(v, h, generator=g) * 0.5)
    hidden = torch.randn(n, h, generator=g).to(dtype).requires_grad_(True)
    targets = torch.randint(0, v, (n,), generator=g)
    return head, hidden, targets


def _as_module_head(head):
    """The same head behind a module call (not a bare nn.Linear): the checkpointed path, as for a
    ZeRO-3 partitioned head."""
    return torch.nn.Sequential(head)


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("chunk", [1, 5, 37, 100])
def test_chunked_values_and_gradients_equal_the_full_computation(chunk, fused):
    # float64: the two computations sum in different orders, and in fp32 a gradient near 1 can differ by
    # 10 ulps (1.2e-6, seen on a loaded CI box); the property is the maths, not one CPU's rounding
    linear, hidden, targets = _case(torch.float64)
    head = linear if fused else _as_module_head(linear)
    w = torch.linspace(-1, 1, hidden.shape[0])  # arbitrary cotangents for logp and entropy
    logp, ent, _ = chunked_logprobs_and_entropy(head, hidden, targets, chunk_tokens=chunk)
    ((logp * w).sum() + (ent * w.flip(0)).sum()).backward()
    grads = hidden.grad.clone(), linear.weight.grad.clone()
    hidden.grad = linear.weight.grad = None
    ref_logp, ref_ent, _ = _full(head, hidden, targets)
    ((ref_logp * w).sum() + (ref_ent * w.flip(0)).sum()).backward()
    torch.testing.assert_close(logp, ref_logp, rtol=0, atol=1e-6)
    torch.testing.assert_close(ent, ref_ent, rtol=0, atol=1e-6)
    torch.testing.assert_close(grads[0], hidden.grad, rtol=0, atol=1e-6)
    torch.testing.assert_close(grads[1], linear.weight.grad, rtol=0, atol=1e-6)


def test_bf16_model_chunks_upcast_like_the_full_computation():
    head, hidden, targets = _case(torch.bfloat16)
    with torch.no_grad():
        logp, ent, _ = chunked_logprobs_and_entropy(head, hidden, targets, chunk_tokens=8)
        ref_logp, ref_ent, _ = _full(head, hidden, targets)
    assert logp.dtype == torch.float32
    torch.testing.assert_close(logp, ref_logp, rtol=0, atol=1e-6)
    torch.testing.assert_close(ent, ref_ent, rtol=0, atol=1e-6)


def test_bf16_gradients_match_autograd_through_the_upcast():
    head, hidden, targets = _case(torch.bfloat16)
    w = torch.linspace(-1, 1, hidden.shape[0])
    logp, ent, _ = chunked_logprobs_and_entropy(head, hidden, targets, chunk_tokens=8)
    ((logp * w).sum() + (ent * w.flip(0)).sum()).backward()
    grads = hidden.grad.float(), head.weight.grad.float()
    hidden.grad = head.weight.grad = None
    ref_logp, ref_ent, _ = _full(head, hidden, targets)
    ((ref_logp * w).sum() + (ref_ent * w.flip(0)).sum()).backward()
    # both cast d logits to bf16 before the head's matmuls: equal up to bf16 rounding of the sums
    torch.testing.assert_close(grads[0], hidden.grad.float(), rtol=2e-2, atol=2e-3)
    torch.testing.assert_close(grads[1], head.weight.grad.float(), rtol=2e-2, atol=2e-3)


def test_fused_predicted_entropy_change_equals_the_separate_pass():
    head, hidden, targets = _case(torch.float64)
    adv = torch.linspace(-2, 2, hidden.shape[0], dtype=torch.float64)
    with torch.no_grad():
        _, _, dh = chunked_logprobs_and_entropy(head, hidden, targets, chunk_tokens=6, advantages=adv)
        _, _, logp_full = _full(head, hidden, targets)
        ref = predicted_entropy_change(logp_full[None], targets[None], adv[None])[0]
    torch.testing.assert_close(dh, ref, rtol=1e-12, atol=1e-14)


def _saved_numel(fn, weight) -> int:
    """Elements of every tensor autograd saves for the backward while `fn` runs (the head's weight,
    saved by reference, aside)."""
    total = 0

    def pack(t):
        nonlocal total
        if t.data_ptr() != weight.data_ptr():
            total += t.numel()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return total


@pytest.mark.parametrize("fused", [True, False])
def test_backward_keeps_no_vocabulary_sized_activation(fused):
    linear, hidden, targets = _case(torch.float32, n=64, h=16, v=1000)
    head = linear if fused else _as_module_head(linear)
    chunked = _saved_numel(lambda: chunked_logprobs_and_entropy(head, hidden, targets, chunk_tokens=16), linear.weight)
    full = _saved_numel(lambda: _full(head, hidden, targets)[:2], linear.weight)
    n, v = hidden.shape[0], linear.out_features
    assert full >= n * v  # the reference keeps at least the [N, V] log-softmax
    assert chunked < n * v / 10  # only the chunks' inputs (hidden rows, targets) are kept


def _peak_live_tensors(fn, min_numel: int) -> int:
    """The most tensors of >= min_numel elements (distinct storages) alive at once while fn runs,
    checked after every aten op (forward and backward: this thread runs both on CPU)."""
    import weakref

    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    class Live(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.refs: dict[int, list] = {}  # storage pointer -> weak refs to the tensors on it
            self.peak = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in tree_flatten(out)[0]:
                if isinstance(t, torch.Tensor) and t.numel() >= min_numel:
                    self.refs.setdefault(t.untyped_storage().data_ptr(), []).append(weakref.ref(t))
            self.refs = {p: r for p, r in self.refs.items() if any(x() is not None for x in r)}
            self.peak = max(self.peak, len(self.refs))
            return out

    mode = Live()
    with mode:
        fn()
    return mode.peak


def test_a_fused_chunk_holds_at_most_two_vocabulary_sized_tensors_at_once():
    linear, hidden, targets = _case(torch.float32, n=64, h=8, v=1000)  # the [V, H] weight < one [C, V] chunk
    chunk = 16

    def forward_backward():
        logp, ent, _ = chunked_logprobs_and_entropy(linear, hidden, targets, chunk_tokens=chunk)
        (logp.sum() + 0.1 * ent.sum()).backward()

    def full():
        logp, ent, _ = _full(linear, hidden, targets)
        (logp.sum() + 0.1 * ent.sum()).backward()

    assert _peak_live_tensors(forward_backward, chunk * 1000) == 2
    assert _peak_live_tensors(full, 64 * 1000) >= 3  # the reference: log p, p, p log p, ... at once


def test_stare_plan_counts_the_vocabulary_sized_tensors_each_head_path_holds():
    from stare.plan.sizes import CHUNK_TENSORS

    linear, hidden, targets = _case(torch.float32, n=64, h=8, v=1000)
    chunk = 16
    for head, zero3 in ((linear, False), (ChunkedHead(linear, chunk), True)):  # fused; the learner's (ZeRO-3) head

        def forward_backward():
            if zero3:
                logp, ent, _ = head(hidden, targets)  # one module call over every chunk
            else:
                logp, ent, _ = chunked_logprobs_and_entropy(head, hidden, targets, chunk_tokens=chunk)
            (logp.sum() + 0.1 * ent.sum()).backward()

        assert _peak_live_tensors(forward_backward, chunk * 1000) == CHUNK_TENSORS[zero3]


@pytest.mark.parametrize("pack", [False, True])
def test_response_stats_of_a_real_model_equal_the_full_logits_path(pack):
    torch.manual_seed(0)
    model = random_qwen2(dtype=torch.float64).eval()
    trajs = trajectories(1)
    batch = collate(trajs, pad_id=0, rows=len(trajs))
    with torch.no_grad():
        ref_logp, ref_ent = token_logprobs_and_entropy(
            model(
                input_ids=batch.input_ids, attention_mask=batch.attention_mask, position_ids=batch.position_ids
            ).logits,
            batch,
        )  # [S, L] each, from the whole step's [S, P + L, V] logits
        policy = Policy(
            hidden=hidden_state_fn(model, model, torch.device("cpu")),
            lm_head=model.lm_head,
            device=torch.device("cpu"),
            chunk_tokens=5,
        )
        rows = [0, 3, 4, 7]
        mb = build_micro_batch(rows, batch.prompts, batch.responses, pad_id=0, pack=pack)
        logp, ent, _ = response_stats(policy, mb)  # [4, length]
    real = batch.mask.new_zeros(len(rows), mb.length)
    for b, r in enumerate(rows):
        real[b, : batch.lengths[r]] = True
    torch.testing.assert_close(logp[real], ref_logp[rows, : mb.length][real], rtol=0, atol=1e-10)
    torch.testing.assert_close(ent[real], ref_ent[rows, : mb.length][real], rtol=0, atol=1e-10)
    assert torch.all(logp[~real] == 0)
