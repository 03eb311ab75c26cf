"""LoRA adapters through peft (`model.lora`): wrap the policy, merge for the rollout engines, export.

    wrap(model, cfg)            the peft model: base weights frozen, adapters trainable
    merged_state_dict(model)    base + (alpha / r) B A per adapted linear, under the base model's own
                                names: what the rollout engines load and the merged export writes
    export_lora(...)            a checkpoint's adapters onto the base model: merged, or the adapter dir

The merge reads whole weights (ZeRO 0-2; the config refuses ZeRO-3 with LoRA) and leaves the
training model untouched (peft's in-place merge_adapter/unmerge_adapter would add rounding to the
base weights at every publish). peft is imported here only (`pip install 'stare[lora]'`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from stare.weight_sync.buckets import tensor_aliases

ADAPTER = "default"  # peft's adapter name


def _peft():
    try:
        import peft
    except ImportError:
        raise ImportError("model.lora needs peft: pip install 'stare[lora]'") from None
    return peft


def peft_config(cfg: Any):
    """peft's LoraConfig from the run's model.lora section (or its dump)."""
    c = cfg if isinstance(cfg, dict) else cfg.model_dump()
    return _peft().LoraConfig(
        r=c["r"],
        lora_alpha=c["alpha"],
        lora_dropout=c["dropout"],
        target_modules=c["target_modules"],
        bias="none",
        task_type="CAUSAL_LM",
    )


def wrap(model: nn.Module, cfg: Any) -> nn.Module:
    """The peft model around `model`: only the adapters require grad."""
    return _peft().get_peft_model(model, peft_config(cfg))


def merged_state_dict(model: nn.Module, where: str = "host") -> dict[str, torch.Tensor]:
    """The base model's state dict with every adapter merged in (fresh copies), named as the base
    model names it (no `base_model.model.` prefix, no `base_layer`, no adapter tensors). `where`
    (`system.weight_sync_publish_from` resolved): host: on CPU; device: on the model's own device
    (the NCCL send reads it there, no host round trip)."""
    from peft.tuners.lora import LoraLayer

    base = model.get_base_model()
    deltas: dict[str, torch.Tensor] = {}
    with torch.no_grad():
        for name, module in base.named_modules():
            if isinstance(module, LoraLayer) and ADAPTER in module.lora_A:
                deltas[f"{name}.weight"] = module.get_delta_weight(ADAPTER)  # (alpha / r) B A, [out, in]
        out: dict[str, torch.Tensor] = {}
        state = base.state_dict()
        aliases = tensor_aliases(state)  # tied weights: one copy, every name (the broadcast sends it once)
        for name, tensor in state.items():
            if ".lora_" in name:
                continue
            clean = name.replace(".base_layer.", ".")
            if clean not in deltas and name in aliases and aliases[name].replace(".base_layer.", ".") in out:
                out[clean] = out[aliases[name].replace(".base_layer.", ".")]
                continue
            merged = tensor + deltas[clean].to(tensor.dtype) if clean in deltas else tensor
            out[clean] = merged.detach().to("cpu" if where == "host" else merged.device, copy=True)
    return out


def adapter_state(module_state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The adapter tensors of a checkpoint's module state (DeepSpeed's names: the peft model's)."""
    return {k: v for k, v in module_state.items() if ".lora_" in k}


def export_lora(
    model_path: Path, adapters: dict[str, torch.Tensor], lora: dict, out: Path, *, dtype: torch.dtype
) -> nn.Module | None:
    """The base model with the checkpoint's `adapters`: written as peft's adapter directory into
    `out` (lora["export"] == "adapter"; returns None), or merged and returned (the caller saves it as
    a whole Hugging Face model). Raises ValueError when the adapters do not fit the base model."""
    from transformers import AutoModelForCausalLM

    model = wrap(AutoModelForCausalLM.from_pretrained(model_path, dtype=dtype), lora)
    result = model.load_state_dict(adapters, strict=False)
    missing = [k for k in result.missing_keys if ".lora_" in k]
    if missing or result.unexpected_keys or not adapters:
        raise ValueError(
            f"the checkpoint's adapters do not fit the base model {model_path}: missing {missing[:5]}, "
            f"unexpected {result.unexpected_keys[:5]}, {len(adapters)} adapter tensors"
        )
    if lora.get("export", "merged") == "adapter":
        model.save_pretrained(out, safe_serialization=True)
        return None
    return model.merge_and_unload()
