"""What several check groups need: whether CUDA and vLLM are here, a tiny model on disk, a command with a limit."""

from __future__ import annotations

import importlib.util
import json
import subprocess
from pathlib import Path

# A random Qwen2-shaped model small enough for every engine: head_dim 64 (vLLM's CUDA and CPU attention both
# take it), untied head, vocabulary 512; weights drawn wide (initializer_range 0.2) so that next-token
# distributions are peaked and two random models' log-probs differ by O(1). Built from this config, nothing downloaded.
TINY = {
    "architectures": ["Qwen2ForCausalLM"],
    "model_type": "qwen2",
    "vocab_size": 512,
    "hidden_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "intermediate_size": 256,
    "max_position_embeddings": 512,
    "tie_word_embeddings": False,
    "eos_token_id": 2,
    "bos_token_id": 1,
    "rms_norm_eps": 1e-6,
    "initializer_range": 0.2,
    "torch_dtype": "float32",
}


def cuda() -> str | None:
    """Why CUDA cannot be used here (None: it can)."""
    import torch

    if not torch.cuda.is_available():
        return "no CUDA device visible to torch " + (
            f"(torch {torch.__version__}, a CPU build)"
            if torch.version.cuda is None
            else f"(CUDA {torch.version.cuda})"
        )
    return None


def gpus() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def missing(module: str) -> str | None:
    """Why `module` cannot be imported here (None: it can)."""
    if importlib.util.find_spec(module) is None:
        return f"{module} is not installed here"
    return None


def tiny_model(folder: Path, seed: int = 0, **config) -> Path:
    """A random TINY model (with `config` changes) saved under `folder` (safetensors + config.json)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    folder.mkdir(parents=True, exist_ok=True)
    if not (folder / "config.json").is_file():
        torch.manual_seed(seed)
        cfg = AutoConfig.for_model(
            **{k: v for k, v in {**TINY, **config}.items() if k != "model_type"}, model_type="qwen2"
        )
        dtype = torch.bfloat16 if config.get("torch_dtype") == "bfloat16" else torch.float32
        AutoModelForCausalLM.from_config(cfg, dtype=dtype).save_pretrained(folder)
        (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": TINY["eos_token_id"]}))
    return folder


def command(cmd: list[str], timeout_s: float) -> tuple[int, str]:
    """(exit code, stdout + stderr) of `cmd`; (-1, why) when it is absent or runs past `timeout_s`."""
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    except FileNotFoundError:
        return -1, f"{cmd[0]} not found"
    except subprocess.TimeoutExpired:
        return -1, f"{' '.join(cmd)} ran past {timeout_s:.0f} s"
    return proc.returncode, proc.stdout + proc.stderr
