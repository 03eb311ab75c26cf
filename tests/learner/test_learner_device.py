"""Every input, buffer and accumulator of a learner step lives on the model's device.

The model here lives on the meta device: meta tensors carry no data and do not mix with CPU
tensors, so any step tensor left on the host (a batch not moved, a buffer or a metric sum
allocated without the device) raises, and so does any read-back to the host inside the passes.
"""

import torch
from learner_helpers import VOCAB, trajectories
from torch import nn

from learner.algorithm.step_plan import StepTokens, mean_entropy, plan_step
from learner.step.batch import collate
from learner.step.forward_passes import Policy, prepass, train_pass
from learner.step.micro_batches import build_micro_batch, filler_micro_batch, plan_rows
from stare.config.algo import StareLossConfig

META = torch.device("meta")


class MetaLM(nn.Module):
    """A causal LM's interface reduced to what the passes use: hidden states and an output head."""

    def __init__(self, hidden: int = 8):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, hidden)
        self.pos = nn.Embedding(256, hidden)
        self.lm_head = nn.Linear(hidden, VOCAB, bias=False)

    def hidden(self, mb) -> torch.Tensor:  # [R, T, H]
        assert mb.input_ids.device == META and mb.position_ids.device == META, "micro-batch not moved"
        return torch.tanh(self.embed(mb.input_ids) + self.pos(mb.position_ids))


def _host_step(pack: bool):
    trajs = trajectories(4)
    batch = collate(trajs, pad_id=0, rows=len(trajs) + 2)
    lens = [len(p) for p in batch.prompts], [len(r) for r in batch.responses]
    groups = plan_rows(*lens, micro_batch=4, max_tokens=24 if pack else None, pack=pack)
    mbs = [build_micro_batch(g, batch.prompts, batch.responses, pad_id=0, pack=pack) for g in groups]
    return batch, mbs + [filler_micro_batch(0, pack=pack)]


def test_prepass_plan_and_train_pass_run_entirely_on_the_model_device():
    model = MetaLM().to(META)
    policy = Policy(hidden=model.hidden, lm_head=model.lm_head, device=META, chunk_tokens=5)
    for pack in (False, True):
        host_batch, mbs = _host_step(pack)
        batch = host_batch.to(META)
        old, ent, dh = prepass(policy, mbs, batch, predicted_entropy_change=True)
        assert {old.device, ent.device, dh.device} == {META}
        tokens = StepTokens(old, ent, batch.advantages, batch.token_uid, batch.mask)
        cfg = StareLossConfig(variant="C2")
        ctx = plan_step(tokens, cfg, gate=1.0, w=1.2, m=0.8)
        h = mean_entropy(ent, batch.mask, cfg.agg_mode)
        losses = []
        sums, quadrants = train_pass(
            policy, mbs, batch, old, ent, dh, ctx, cfg, h, lambda loss, last: (losses.append(loss), loss.backward())
        )
        assert len(losses) == len(mbs) and {loss.device for loss in losses} == {META}
        assert {t.device for t in sums.values()} == {META} and quadrants.device == META
        assert model.lm_head.weight.grad.device == META


def test_the_reference_pass_and_its_loss_term_run_on_the_model_device():
    import contextlib

    from learner.step.reference import Reference, reference_pass

    model, frozen = MetaLM().to(META), MetaLM().to(META).requires_grad_(False)
    policy = Policy(hidden=model.hidden, lm_head=model.lm_head, device=META, chunk_tokens=5)
    ref_policy = Policy(hidden=frozen.hidden, lm_head=frozen.lm_head, device=META, chunk_tokens=5)
    reference = Reference(ref_policy, contextlib.nullcontext, {}, frozen)
    host_batch, mbs = _host_step(pack=True)
    batch = host_batch.to(META)
    old, ent, dh = prepass(policy, mbs, batch, predicted_entropy_change=False)
    ref = reference_pass(reference, mbs, batch)
    assert ref.device == META and ref.shape == old.shape
    cfg = StareLossConfig(ref_kl={"coef": 0.1}, entropy_coef=0.01)
    ctx = plan_step(StepTokens(old, ent, batch.advantages, batch.token_uid, batch.mask), cfg, gate=1.0, w=1.2, m=0.8)
    h = mean_entropy(ent, batch.mask, cfg.agg_mode)
    sums, _ = train_pass(policy, mbs, batch, old, ent, dh, ctx, cfg, h, lambda loss, last: loss.backward(), ref=ref)
    assert {"ref_kl_sum", "ref_kl_loss", "entropy_bonus"} <= set(sums) and sums["ref_kl_sum"].device == META
    assert model.lm_head.weight.grad.device == META and frozen.lm_head.weight.grad is None
