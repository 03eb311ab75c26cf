"""A Hugging Face model directory from a learner checkpoint: `stare export`, and runs/<name>/hf/.

    export_checkpoint(run_dir / "checkpoints", out, model_path=..., step=None)

reads the DeepSpeed checkpoint the learner wrote (`Learner.save`: checkpoints/step_NNNNNN/ and a
`latest` pointer) and writes `out/` with model.safetensors (sharded when large), config.json,
generation_config.json and the tokenizer files, loadable by `AutoModelForCausalLM.from_pretrained`
and by vLLM.

Weights: under ZeRO 0-2 the checkpoint's `mp_rank_00_model_states.pt` holds the whole module in
the training dtype: those are exactly the weights the learner computed with. Under ZeRO-3 the
module is partitioned across the ranks' files; DeepSpeed's `zero_to_fp32` merges the fp32 master
copies, cast here to the training dtype (the module's bf16 weights are those masters rounded, so
the result is the same). The architecture, tokenizer and generation config come from the run's
base model directory (`model_path`); the checkpoint must match it (strict load, the error names
the missing or unexpected keys).

With LoRA (`model.lora`, recorded in the checkpoint's trainer_state.json) the checkpoint holds the
adapters only: they are loaded onto the base model and written merged (a whole model, as above) or
as peft's adapter directory (`model.lora.export: adapter`), with the tokenizer files.

`export_run(run_dir, model_path, log)` is the end-of-run hook: the latest checkpoint into
`run_dir/hf`, by rank 0 only (other ranks return at once).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch

MODEL_STATES = "mp_rank_00_model_states.pt"


class ExportError(RuntimeError):
    """No checkpoint to export, or one that does not fit the base model; the message says which."""


def checkpoint_tag(ckpt_dir: Path, step: int | None) -> str:
    ckpt_dir = Path(ckpt_dir)
    if step is not None:
        tag = f"step_{step:06d}"
        if not (ckpt_dir / tag).is_dir():
            have = sorted(p.name for p in ckpt_dir.glob("step_*")) if ckpt_dir.is_dir() else []
            raise ExportError(f"--step {step}: no checkpoint {ckpt_dir / tag}; the run has {have or 'none'}")
        from learner.engine.checkpoints import checkpoint_problem

        problem = checkpoint_problem(ckpt_dir, tag)  # a checkpoint still being written has no manifest yet
        if problem is not None:
            raise ExportError(f"--step {step}: {ckpt_dir / tag} is not a whole checkpoint ({problem}); export another")
        return tag
    if not (ckpt_dir / "latest").is_file() and not any(ckpt_dir.glob("step_*")):
        raise ExportError(f"{ckpt_dir}: no checkpoint (no 'latest' file); train the run first")
    import logging

    from learner.engine.checkpoints import choose_checkpoint

    # the verified one: a damaged latest falls back to the previous complete checkpoint, with a warning
    return choose_checkpoint(ckpt_dir, logging.getLogger(__name__).warning)


def checkpoint_state_dict(ckpt_dir: Path, tag: str, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """The whole model's weights (CPU, `dtype`) of checkpoint `tag` under `ckpt_dir`."""
    folder = Path(ckpt_dir) / tag
    states = folder / MODEL_STATES
    if states.is_file():  # ZeRO 0, 1, 2: the full module, in the training dtype
        saved = torch.load(states, map_location="cpu", weights_only=False)
        module = saved["module"]
        if all(t.numel() > 0 for t in module.values()):
            return {k: v.to(dtype) for k, v in module.items()}
    try:
        from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint
    except ImportError:
        raise ExportError(
            f"{folder} is a ZeRO-3 checkpoint: merging it needs DeepSpeed: pip install 'stare[learner]'"
        ) from None
    merged = get_fp32_state_dict_from_zero_checkpoint(str(ckpt_dir), tag=tag)
    return {k: v.to(dtype) for k, v in merged.items()}


def export_checkpoint(
    ckpt_dir: Path, out: Path, *, model_path: Path, step: int | None = None, dtype: str = "float32"
) -> Path:
    """Write checkpoint `step` (None: the latest) as a Hugging Face directory `out`; returns `out`."""
    from transformers import AutoTokenizer, GenerationConfig

    ckpt_dir, out = Path(ckpt_dir), Path(out)
    tag = checkpoint_tag(ckpt_dir, step)
    from stare.models.resolve import torch_dtype as dtype_of

    torch_dtype = dtype_of(dtype)
    state = checkpoint_state_dict(ckpt_dir, tag, torch_dtype)
    trainer_state = ckpt_dir / tag / "trainer_state.json"
    lora = json.loads(trainer_state.read_text()).get("lora") if trainer_state.is_file() else None
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent, prefix=f".{out.name}.tmp-") as tmp:
        staged = Path(tmp) / "hf"
        if lora is not None:  # the checkpoint holds the adapters: onto the base model, merged or as an adapter dir
            from learner.engine.lora import adapter_state, export_lora

            try:
                model = export_lora(model_path, adapter_state(state), lora, staged, dtype=torch_dtype)
            except ValueError as err:
                raise ExportError(f"{ckpt_dir / tag}: {err}") from None
        else:
            model = _full_model(state, ckpt_dir / tag, model_path, torch_dtype)
        if model is not None:
            # no generation_config.json: save_pretrained writes the one derived from config.json
            with contextlib.suppress(OSError):
                model.generation_config = GenerationConfig.from_pretrained(model_path)
            model.save_pretrained(staged, safe_serialization=True)
        AutoTokenizer.from_pretrained(model_path).save_pretrained(staged)
        step_done = json.loads(trainer_state.read_text())["step"] if trainer_state.is_file() else None
        (staged / "export_info.json").write_text(
            json.dumps(
                {
                    "checkpoint": str(ckpt_dir / tag),
                    "step": step_done,
                    "base_model": str(model_path),
                    "dtype": dtype,
                    **({"lora": lora} if lora is not None else {}),
                },
                indent=1,
            )
        )
        umask = os.umask(0)
        os.umask(umask)
        for f in staged.iterdir():  # safetensors writes 0600 files; give them the usual mode
            f.chmod(0o666 & ~umask)
        if out.exists():
            shutil.rmtree(out)
        os.replace(staged, out)
    return out


def _full_model(state: dict[str, torch.Tensor], folder: Path, model_path: Path, dtype: torch.dtype):
    """The base model's architecture with the checkpoint's whole weights (strict: the error names the
    missing or unexpected keys)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(model_path)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    result = model.load_state_dict(state, strict=False, assign=True)
    tied = set(getattr(model, "_tied_weights_keys", None) or ())
    missing = [k for k in result.missing_keys if not (getattr(config, "tie_word_embeddings", False) and k in tied)]
    if missing or result.unexpected_keys:
        raise ExportError(
            f"{folder} does not fit the base model {model_path}: missing {missing[:5]}, "
            f"unexpected {result.unexpected_keys[:5]}"
        )
    model.tie_weights()
    if any(p.is_meta for p in model.parameters()):
        raise ExportError(f"{folder}: weights left unset after loading (tied or buffer keys?)")
    return model


def export_run(
    run_dir: Path, model_path: Path, log: Callable[[str], None] = print, dtype: str = "float32"
) -> Path | None:
    """End of a run: its latest checkpoint into run_dir/hf (rank 0 only; None when nothing was written)."""
    if int(os.environ.get("RANK", "0")) != 0:
        return None
    try:
        out = export_checkpoint(Path(run_dir) / "checkpoints", Path(run_dir) / "hf", model_path=model_path, dtype=dtype)
    except ExportError as err:
        log(f"no Hugging Face export: {err}")
        return None
    log(f"Hugging Face model: {out}")
    return out
