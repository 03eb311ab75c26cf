"""The frozen reference policy of `loss.ref_kl`: the run's base model, read in the learner's no-grad pre-pass.

    reference = build_reference(cfg, model_path, ...)      # None without loss.ref_kl
    ref = reference_pass(reference, micro_batches, step)   # [S, L] log pi_ref of every response token

Where its weights live (huggingface/trl trl/models/utils.py `prepare_deepspeed` places its reference the same way):
* ZeRO 0-2: the base model's weights, whole, on the learner's device in the model dtype: one more b x P bytes per
  rank; requires_grad off, eval mode, no optimizer, no gradients.
* ZeRO-3: a DeepSpeed engine without optimizer at stage 3, partitioned over the ranks like the policy's 16-bit
  weights and gathered layer by layer in its forward; its output head is an external parameter of its own
  `ChunkedHead`, as the policy's is, so every rank makes the same gathers (fillers run it too).
* LoRA: no copy: the policy's own module with peft's adapters disabled is the base model exactly (TRL reads its
  reference log-probs the same way, `disable_adapter()`).

Frozen: it is in no optimizer and in no checkpoint (the base folder holds it). Its `digest` (the base folder's
content hash, stare.observe.machine.model_digest) goes into every checkpoint's trainer_state.json; loading a
checkpoint whose digest differs is refused (`check_digest`), so a resumed run's reference is the one it started
with. Cost: one more no-grad forward of every response token per step (2N FLOPs per token, as the pre-pass).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from learner.engine import deepspeed_engine as ds
from learner.engine.checkpoints import CheckpointError
from learner.step.batch import TrainBatch
from learner.step.forward_passes import Policy, hidden_state_fn, response_stats
from learner.step.logprobs import attach_chunked_head
from learner.step.micro_batches import MicroBatch
from stare.config import TrainConfig
from stare.observe.machine import model_digest


@dataclass(frozen=True)
class Reference:
    policy: Policy  # the reference weights' hidden states, chunked head and device
    scope: Callable[[], AbstractContextManager[Any]]  # entered around its forwards (LoRA: the adapters off)
    digest: dict[str, Any]  # model_digest of the base folder it was read from
    module: nn.Module | None  # its own module (None under LoRA: the policy's, adapters off)


def build_reference(
    cfg: TrainConfig,
    model_path: Path,
    *,
    policy: Policy,
    policy_module: nn.Module,
    ds_config: dict[str, Any],
    dtype: torch.dtype,
) -> Reference | None:
    """The reference of `cfg.loss.ref_kl` (None when it is off); see the module docstring."""
    if cfg.loss.ref_kl is None:
        return None
    digest = model_digest(model_path)
    if cfg.model.lora is not None:  # the policy with its adapters off is the base model
        return Reference(policy, lambda: _adapters_off(policy_module), digest, None)
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=dtype)
    model.requires_grad_(False)
    head = attach_chunked_head(model, cfg.optim.logits_chunk_tokens)
    forward: Callable[..., Any]
    if ds_config["zero_optimization"]["stage"] == 3:  # sharded like the policy, no optimizer
        engine = ds.build_engine(model, ds.inference_config(ds_config), external={head: head.weight})
        module, forward = engine.module, engine
    else:
        module = model.to(policy.device)
        forward = module
    module.eval()
    ref = Policy(
        hidden=hidden_state_fn(forward, module, policy.device),
        lm_head=head.lm_head,
        device=policy.device,
        chunk_tokens=cfg.optim.logits_chunk_tokens,
        head=head,
    )
    return Reference(ref, contextlib.nullcontext, digest, module)


@contextlib.contextmanager
def _adapters_off(module: nn.Module) -> Iterator[None]:
    with module.disable_adapter():  # type: ignore[operator]  (peft's PeftModel)
        yield


@torch.no_grad()
def reference_pass(
    reference: Reference,
    micro_batches: list[MicroBatch],  # on the host: the pre-pass's, fillers included
    step: TrainBatch,  # on the device
) -> Tensor:  # [S, L] log pi_ref of every response token, 0 elsewhere
    """The reference's log-probs over the pre-pass's micro-batches (a filler runs its forward too: under
    ZeRO-3 every rank makes the same gathers)."""
    policy = reference.policy
    S, L = step.mask.shape
    dtype = torch.promote_types(next(policy.lm_head.parameters()).dtype, torch.float32)  # the chunks' dtype
    out = torch.zeros(S, L, dtype=dtype, device=policy.device)
    with reference.scope():
        for host_mb in micro_batches:
            mb = host_mb.to(policy.device)
            logp, _, _ = response_stats(policy, mb)  # [B, length]
            if not host_mb.filler:
                out[mb.rows, : mb.length] = logp
    return out


def check_digest(reference: Reference | None, state: dict[str, Any], checkpoint: Path) -> None:
    """A checkpoint's recorded reference against this learner's (a checkpoint from before `loss.ref_kl` was on,
    or from a run without it, records none: nothing to compare)."""
    recorded = state.get("reference")
    if reference is None or recorded is None:
        return
    keys = ("sha256", "files", "bytes")
    if any(recorded.get(k) != reference.digest.get(k) for k in keys):
        raise CheckpointError(
            f"{checkpoint}: its run's reference model (loss.ref_kl) was {recorded.get('path')} "
            f"({_describe(recorded)}), but the base model now at {reference.digest.get('path')} differs "
            f"({_describe(reference.digest)}); resume with the base model the run started from (model.path)"
        )


def _describe(digest: dict[str, Any]) -> str:
    sha = digest.get("sha256")
    return f"sha256 {sha[:12]}..." if sha else f"{digest.get('files')} files, {digest.get('bytes')} bytes"
