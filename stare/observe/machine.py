"""What a run ran on: the model's content hash, torch's build and CPU kernels, package versions.

`stare train` writes it to runs/<name>/machine.json and the report prints it, so two runs that
start from different held-out numbers can be told apart by build (a different tiny model), by
kernels (another CPU capability or BLAS) or neither. Cheap: the model files are hashed only up to
`HASH_LIMIT_BYTES` in all (the tiny model is a few MB; a 7B checkpoint gets sizes only).
"""

from __future__ import annotations

import hashlib
import platform
from importlib import metadata
from pathlib import Path
from typing import Any

HASH_LIMIT_BYTES = 1 << 30
# not hashed: how the files were made (the tiny model's build log: its wall times differ from one build of
# the same weights to the next, which made two identical models two fingerprints)
NOT_HASHED = frozenset({"build_info.json"})
PACKAGES = ("torch", "transformers", "tokenizers", "deepspeed", "numpy", "safetensors", "accelerate", "stare")


def model_digest(path: Path | str | None) -> dict[str, Any]:
    """sha256 over the model folder's files but `NOT_HASHED` (relative name, then bytes, in sorted order)
    when they total at most HASH_LIMIT_BYTES; otherwise the file count and bytes only (`sha256` None)."""
    if path is None or not Path(path).is_dir():
        return {"path": None if path is None else str(path), "sha256": None}
    root = Path(path)
    files = sorted(p for p in root.rglob("*") if p.is_file())
    size = sum(p.stat().st_size for p in files)
    digest = None
    if size <= HASH_LIMIT_BYTES:
        h = hashlib.sha256()
        for p in (f for f in files if f.name not in NOT_HASHED):
            h.update(str(p.relative_to(root)).encode() + b"\0")
            h.update(p.read_bytes())
        digest = h.hexdigest()
    return {"path": str(root), "sha256": digest, "files": len(files), "bytes": size}


def _cpu_model() -> str | None:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def _version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def torch_build() -> dict[str, Any]:
    """torch's version, threads and the CPU kernels it dispatches to (the ATen CPU capability,
    MKL, oneDNN), which decide float summation order and so the last bits of every matmul."""
    import torch

    backends = torch.backends
    return {
        "version": torch.__version__,
        "threads": torch.get_num_threads(),
        "interop_threads": torch.get_num_interop_threads(),
        "cpu_capability": backends.cpu.get_cpu_capability(),
        "mkl": backends.mkl.is_available(),
        "mkldnn": backends.mkldnn.is_available(),
        "openmp": backends.openmp.is_available(),
        "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
        "cuda": torch.version.cuda,
    }


def fingerprint(model_path: Path | str | None) -> dict[str, Any]:
    """The run's machine record (machine.json)."""
    return {
        "model": model_digest(model_path),
        "torch": torch_build(),
        "packages": {name: _version(name) for name in PACKAGES},
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu": _cpu_model(),
        "cpu_count": __import__("os").cpu_count(),
    }
