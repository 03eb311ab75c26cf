"""environment: what is installed against what stare asks for, and whether torch reaches the GPU."""

from __future__ import annotations

import importlib.metadata as md
import re
from pathlib import Path

from stare.app.doctor.checks.common import command
from stare.app.doctor.registry import Check, Context, Row, timed

# The releases the GPU paths were read against (vLLM's engine core, DeepSpeed's offload_states, torch's NCCL
# process group): another version may work, but is the first suspect when a GPU check fails.
READ_AGAINST = {"torch": "2.13.0", "vllm": "0.32.0", "deepspeed": "0.19.8"}
OPTIONAL = ("deepspeed", "vllm", "peft")  # extras: the learner, vLLM rollout, LoRA

CHECKS = [
    Check(
        "environment.packages",
        "stare's requirements (pyproject.toml) are installed at versions they allow; "
        "DeepSpeed, vLLM and peft reported with the versions stare was read against",
        "a package is missing or outside its pin: imports or APIs differ from what stare calls",
        "pip install -e '.[learner,rollout-gpu]' (or the wheels scripts/prepare_gpu_wheels.sh carries) at the pins",
    ),
    Check(
        "environment.cuda",
        "torch sees the GPUs: its CUDA build, the driver, NCCL",
        "the driver is older than torch's CUDA build needs, or no GPU is visible (CUDA_VISIBLE_DEVICES, the "
        "container's --gpus)",
        "a driver at least as new as torch's CUDA (nvidia-smi shows it), or torch built for "
        "the driver's CUDA; give the container the GPUs",
        gpu=True,
    ),
]


def _requirements() -> list[str]:
    """stare's requirement strings: its installed metadata, else the pyproject.toml of this checkout."""
    try:
        return list(md.requires("stare") or [])
    except md.PackageNotFoundError:
        pass
    pyproject = Path(__file__).resolve().parents[4] / "pyproject.toml"
    import tomllib

    project = tomllib.loads(pyproject.read_text())["project"]
    extras = [f"{r}; extra == '{e}'" for e, rs in project.get("optional-dependencies", {}).items() for r in rs]
    return list(project["dependencies"]) + extras


def _version(name: str) -> str | None:
    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return None


def packages() -> Row:
    from packaging.requirements import Requirement

    problems, figures = [], {}
    for line in _requirements():
        req = Requirement(line)
        extra = re.search(r"extra\s*==\s*['\"]([\w-]+)['\"]", str(req.marker or ""))
        name = req.name.lower()
        if extra and name not in OPTIONAL:
            continue  # other extras (services, reward, dev...) are not the node's concern
        if not extra and req.marker is not None and not req.marker.evaluate():
            continue
        have = _version(req.name)
        if name in ("torch", "transformers") or name in OPTIONAL:
            figures[name] = have or "absent"
        if have is None:
            if not extra:
                problems.append(f"{req.name} is not installed ({req})")
            continue
        if req.specifier and not req.specifier.contains(have, prereleases=True):
            problems.append(f"{req.name} {have} is outside {req.specifier}")
    differs = [
        f"{n} {figures[n]} (read against {v})"
        for n, v in READ_AGAINST.items()
        if figures.get(n) not in (None, "absent") and figures[n].split("+")[0] != v
    ]
    note = ("; differs from the versions stare's GPU paths were read against: " + ", ".join(differs)) if differs else ""
    if problems:
        return Row("environment.packages", "fail", "; ".join(problems) + note, figures)
    return Row("environment.packages", "pass", note.lstrip("; "), figures)


def cuda() -> Row:
    import torch

    code, out = command(["nvidia-smi", "--query-gpu=driver_version,name", "--format=csv,noheader"], 20)
    smi = [line.split(",")[0].strip() for line in out.splitlines() if line.strip()] if code == 0 else []
    figures = {
        "torch_cuda": torch.version.cuda or "none",
        "driver": smi[0] if smi else "unknown",
        "nvidia_smi_gpus": len(smi),
    }
    if not torch.cuda.is_available():
        if smi:
            try:
                torch.cuda.init()
                why = "torch.cuda.is_available() is False"
            except Exception as err:
                why = str(err).splitlines()[0]
            return Row(
                "environment.cuda",
                "fail",
                f"nvidia-smi shows {len(smi)} GPU(s) but torch cannot use them: {why}",
                figures,
            )
        return Row(
            "environment.cuda",
            "skip",
            "no GPU here (no CUDA device, nvidia-smi "
            + ("shows none)" if code == 0 else f"unavailable: {out.strip()[:80]})"),
            figures,
        )
    nccl = torch.cuda.nccl.version() if hasattr(torch.cuda, "nccl") else "none"
    figures.update(
        gpus=torch.cuda.device_count(), nccl=".".join(map(str, nccl)) if isinstance(nccl, tuple) else str(nccl)
    )
    return Row("environment.cuda", "pass", "", figures)


def run(ctx: Context, report) -> None:
    check = timed(report)
    check("environment.packages", packages)
    check("environment.cuda", cuda)
