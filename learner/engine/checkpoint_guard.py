"""What a checkpoint records about its model, and what a save or a load that fails says.

- `model_record(module, cfg)`: in trainer_state.json, the shape of every weight, the scalar fields of
  the model's config.json and the run's `model` section. `check_model_fits` compares them with the
  model a resume built, before DeepSpeed loads anything: a model of another shape (another size, another
  model.path, other LoRA settings) is one line naming the fields that differ, never advice to delete a
  checkpoint that is intact.
- `load_failure(err, ...)`: a DeepSpeed load that still fails. Files that matched their manifest's
  digests are not damaged, so the message says so; only where nothing could verify them (a checkpoint
  from before manifests, `run.checkpoint_verify: size`) is moving the folder aside (not deleting it)
  offered.
- `saving(folder)`: a save that fails on a full disk (the errno, or torch's zip writer's RuntimeError
  with no space left on that filesystem) becomes `OSError(ENOSPC)` naming the checkpoint folder, and the
  partial folder (newer than `latest`, no manifest: never loadable) is removed to give the space back.
"""

from __future__ import annotations

import errno
import json
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from learner.engine.checkpoints import CheckpointError
from stare.config import TrainConfig

FULL_DISK_FREE_BYTES = 1 << 20  # after a failed write, less free space than this on its filesystem: it was full
NOT_SHAPE = {"_name_or_path", "transformers_version", "torch_dtype", "dtype", "use_cache", "_attn_implementation"}


def _hf_config(module: Any) -> dict[str, Any]:
    """The scalar fields of the model's config.json (a peft model: its base model's)."""
    config = getattr(module, "config", None)
    if config is None or not hasattr(config, "to_dict"):
        base = getattr(module, "get_base_model", None)
        config = getattr(base(), "config", None) if base is not None else None
    if config is None or not hasattr(config, "to_dict"):
        return {}
    return {
        k: v
        for k, v in config.to_dict().items()
        if isinstance(v, (int, float, str, bool)) and v is not None and k not in NOT_SHAPE
    }


def model_record(module: Any, cfg: TrainConfig) -> dict[str, Any]:
    """What trainer_state.json keeps about the model (ZeRO-3: each weight's whole shape, `ds_shape`)."""
    shapes = {name: list(getattr(p, "ds_shape", p.shape)) for name, p in module.named_parameters()}
    return {"shapes": shapes, "hf_config": _hf_config(module), "run_config": cfg.model.model_dump(mode="json")}


def _flat(prefix: str, value: Any) -> dict[str, Any]:
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for k, v in value.items():
            out.update(_flat(f"{prefix}.{k}", v))
        return out
    return {prefix: value}


def _differ(old: dict[str, Any], new: dict[str, Any]) -> list[tuple[str, Any, Any]]:
    return [(k, old.get(k), new.get(k)) for k in sorted(set(old) | set(new)) if old.get(k) != new.get(k)]


def check_model_fits(record: dict[str, Any] | None, module: Any, cfg: TrainConfig, checkpoint: Path) -> None:
    """Raise CheckpointError when the checkpoint's weights do not have this model's shapes (the module
    docstring); a checkpoint without a record (older) is left to DeepSpeed's load."""
    if not isinstance(record, dict) or not isinstance(record.get("shapes"), dict):
        return
    now = model_record(module, cfg)
    if record["shapes"] == now["shapes"]:
        return
    differing = [
        n for n in sorted(set(record["shapes"]) | set(now["shapes"])) if record["shapes"].get(n) != now["shapes"].get(n)
    ]
    first = differing[0]
    example = f"e.g. {first}: {record['shapes'].get(first, 'absent')} in the checkpoint, {now['shapes'].get(first, 'absent')} here"
    hf = ", ".join(f"{k} {a} -> {b}" for k, a, b in _differ(record.get("hf_config") or {}, now["hf_config"]))
    run = _differ(_flat("model", record.get("run_config") or {}), _flat("model", now["run_config"]))
    parts = [
        f"{checkpoint} holds a model of another shape than this run's ({len(differing)} weights differ, {example})"
    ]
    if hf:
        parts.append(f"config.json (checkpoint -> this run): {hf}")
    if run:
        parts.append("run config (checkpoint -> this run): " + ", ".join(f"{k} {a} -> {b}" for k, a, b in run))
        fix = " ".join(f"--set {k}={json.dumps(a) if not isinstance(a, str) else a}" for k, a, _ in run)
        how = f"resume with the model it was trained with ({fix}), or train this model as a new run (another run.name)"
    else:
        how = "the model folder changed since the checkpoint: restore it, or train this model as a new run (another run.name)"
    parts.append(f"the checkpoint is intact; {how}")
    raise CheckpointError("; ".join(parts))


def load_failure(err: BaseException, checkpoint: Path, verified: bool) -> CheckpointError:
    """The CheckpointError of a DeepSpeed load that failed (`verified`: its files matched their manifest's
    digests when the resume chose it)."""
    first = (str(err).splitlines() or [""])[0][:200]
    what = f"{checkpoint}: DeepSpeed could not load it ({type(err).__name__}: {first})"
    if verified:
        return CheckpointError(
            f"{what}; its files match its manifest, so it is not damaged: this run's model or optimizer settings "
            "(model.*, model.lora, optim.zero_stage, system.learner_ranks) differ from the ones it was saved with "
            f"(see {checkpoint / 'config.yaml'}, when there); resume with those"
        )
    return CheckpointError(
        f"{what}; nothing verified its files (no manifest, or run.checkpoint_verify=size): if they are damaged, move "
        "that folder out of checkpoints/ (keep it) to resume from the previous checkpoint; if this run's model or "
        "optimizer settings changed, resume with the ones it was saved with"
    )


def disk_full(err: BaseException, where: Path) -> bool:
    """Whether `err` (a failed write under `where`) is a full disk: ENOSPC or EDQUOT in its chain, or (torch's
    writer hides the errno) almost no free space left on that filesystem now."""
    seen: BaseException | None = err
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        seen = seen.__cause__ or seen.__context__
    if not isinstance(err, (OSError, RuntimeError)):
        return False
    probe = Path(where)
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    try:
        return shutil.disk_usage(probe).free < FULL_DISK_FREE_BYTES
    except OSError:
        return False


@contextmanager
def saving(folder: Path) -> Iterator[None]:
    """Around the writing of checkpoint `folder`: a full disk is OSError(ENOSPC, filename=folder), and the
    partial folder is removed unless `latest` already names it."""
    folder = Path(folder)
    try:
        yield
    except Exception as err:
        if not disk_full(err, folder):
            raise
        latest = folder.parent / "latest"
        named = latest.read_text(errors="replace").strip() if latest.is_file() else None
        if named != folder.name:
            shutil.rmtree(folder, ignore_errors=True)
        raise OSError(errno.ENOSPC, "No space left on device", str(folder)) from err
