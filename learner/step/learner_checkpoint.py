"""A learner's checkpoint: its DeepSpeed state, its trainer state (step, weight version, controller, lagged
entropy, the model's shapes, the reference's digest), its run config and manifest, `latest` last.

    save(learner, directory, extra) -> tag        load(learner, directory, tag=None) -> trainer state

A process killed anywhere in a save leaves `latest` on the previous whole checkpoint; a file damaged later is
found by the manifest before anything loads (learner.engine.checkpoints); a model of another shape is refused
by name (learner.engine.checkpoint_guard).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import torch.distributed as dist
import yaml

from learner.engine import deepspeed_engine as ds
from learner.engine.checkpoint_guard import check_model_fits, load_failure, model_record, saving
from learner.engine.checkpoints import MANIFEST, TRAINER_STATE, CheckpointError, choose_checkpoint, write_manifest
from learner.step.reference import check_digest
from stare.observe.files import write_atomic

log = logging.getLogger(__name__)


def save(
    learner: Any,  # learner.step.trainer.Learner (it imports this module)
    directory: Path,
    extra: dict[str, Any],
) -> str:
    """A checkpoint under directory/step_N (its run config and trainer_state.json with the model's shapes),
    its manifest (learner.engine.checkpoints) last, then `latest` pointed at it: a process killed anywhere
    in between leaves `latest` on the previous whole checkpoint, a file damaged later is found by the
    manifest before anything loads, and a full disk is OSError(ENOSPC) naming the checkpoint."""
    tag = f"step_{learner.step:06d}"
    with saving(directory / tag):  # a full disk: ENOSPC naming the folder, the partial one removed
        ds.save_checkpoint(learner.engine, directory, tag, trainable_only=learner.lora is not None)  # every rank
        if dist.get_rank() == 0:
            state = {
                "step": learner.step,
                "version": learner.version,
                "controller": learner.controller.state_dict(),
                "lagged_entropy": learner.lagged_entropy,
                "nonfinite_steps": learner.nonfinite_steps,
                **({"lora": learner.lora.model_dump()} if learner.lora is not None else {}),
                "model": model_record(learner.engine.module, learner.cfg),
                **({"reference": learner.reference.digest} if learner.reference is not None else {}),
                **extra,
            }
            write_atomic(directory / tag / "config.yaml", yaml.safe_dump(learner.cfg.model_dump(mode="json")))
            write_atomic(directory / tag / TRAINER_STATE, json.dumps(state, indent=1))
            write_manifest(directory / tag, learner.cfg.run.checkpoint_verify)  # reads every rank's files back
            write_atomic(directory / "latest", tag)
    return tag


def load(learner: Any, directory: Path, tag: str | None = None) -> dict[str, Any]:
    """Checkpoint `tag` (None: the one `choose_checkpoint` verifies); a model of another shape, or a file
    that still fails to load, is a CheckpointError naming the checkpoint (learner.engine.checkpoint_guard)."""
    tag = tag or choose_checkpoint(directory, log.warning, learner.cfg.run.checkpoint_verify)
    path = directory / tag / TRAINER_STATE
    try:
        state = json.loads(path.read_text(encoding="utf-8"))
        step, version = state["step"], state["version"]
    except (ValueError, KeyError, TypeError) as err:
        raise CheckpointError(
            f"{path}: unreadable ({type(err).__name__}: {err}); move {directory / tag} out of checkpoints/ "
            "(keep it) to resume from the previous checkpoint"
        ) from None
    check_digest(learner.reference, state, directory / tag)  # the reference the run started with, or refused
    check_model_fits(state.get("model"), learner.engine.module, learner.cfg, directory / tag)
    try:
        ds.load_checkpoint(learner.engine, directory, tag, trainable_only=learner.lora is not None)
    except (RuntimeError, OSError, EOFError, ValueError, KeyError) as err:
        verified = (directory / tag / MANIFEST).is_file() and learner.cfg.run.checkpoint_verify == "digest"
        raise load_failure(err, directory / tag, verified) from err
    learner.step, learner.version = step, version
    learner.controller.load_state_dict(state["controller"])
    learner.prepared.clear()  # other weights now
    learner.lagged_entropy = state["lagged_entropy"]
    learner.nonfinite_steps = int(state.get("nonfinite_steps", 0))
    return state
