"""The run folder of `stare train`: a new run never overwrites an old one (a folder with any checkpoint
is a run: resume it), a resumed one is the folder named wherever it lives now (relative input paths
resolved against it), and one process at a time writes it (`run_lock`: stare.runtime.run_lock). What a
run needs of the machine and the model (run.threads, the model's context) is checked here too, before
the folder is created or a model loads."""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from learner.engine.checkpoints import holds_checkpoint
from stare.config import ConfigError, TrainConfig, build_config
from stare.models.context import check_context, model_positions
from stare.runtime.run_lock import RunLock
from stare.runtime.threads import check_threads


def prepare_run(cfg: TrainConfig | None, resume: Path | None, overrides: list[str] = ()) -> TrainConfig:
    """The config of a new run (refusing to overwrite one) or of the run to resume.

    A resumed run is the folder named, wherever it lives now: its saved run.output_dir/run.name are
    history, and relative paths in its config.yaml resolve against the folder first (then the
    working directory, where runs started before this rule pointed)."""
    if resume is not None:
        from learner.engine.checkpoints import require_checkpoint

        resumed = run_config(resume, overrides)
        run_dir = resumed.run_dir
        _check_start(resumed)
        # verified before the lock and the setup: a damaged run fails here, untouched
        tag = require_checkpoint(run_dir / "checkpoints", f"--resume {resume}", resumed.run.checkpoint_verify)
        done = _trained_steps(run_dir / "checkpoints" / tag)
        if done is not None and resumed.run.steps is not None and done >= resumed.run.steps:
            raise ConfigError(
                f"--resume {resume}: the run has trained its {done} steps (run.steps="
                f"{resumed.run.steps}); continue it with --set run.steps=N (N > {done})"
            )
        return resumed
    assert cfg is not None
    if cfg.model.path is not None:  # a broken model folder fails here, before the run folder exists
        from stare.models.resolve import check_model_dir

        check_model_dir(Path(cfg.model.path))
    _check_start(cfg)
    refuse_existing_run(cfg.run_dir)
    return cfg


def run_config(folder: Path, overrides: list[str] | tuple[str, ...] = (), flag: str = "--resume") -> TrainConfig:
    """The config of the run in `folder` (its config.yaml with `overrides`), the folder being its run folder;
    an empty or lost config.yaml names the copy its newest checkpoint keeps."""
    from stare.config.files import read_yaml_mapping

    run_dir = Path(folder).resolve()
    saved = run_dir / "config.yaml"
    copy = _config_copy(run_dir / "checkpoints")
    restore = f"restore it from the newest checkpoint: cp {copy} {saved}" if copy else "restore it from a backup"
    if not saved.is_file():
        if holds_checkpoint(run_dir / "checkpoints"):
            raise ConfigError(f"{flag} {folder}: no config.yaml there; {restore}")
        raise ConfigError(f"{flag} {folder}: no config.yaml there; pass a run folder written by `stare train`")
    raw = _paths_against(read_yaml_mapping(saved, empty=restore), run_dir)
    cfg = build_config(raw, overrides=overrides, source=saved)
    cfg._run_dir = run_dir
    return cfg


def _check_start(cfg: TrainConfig) -> None:
    """What the machine and the model allow (stare.runtime.threads, stare.models.context), before anything starts."""
    check_threads(cfg)
    check_context(cfg, *model_positions(cfg, cfg.model.path))


def refuse_existing_run(run_dir: Path) -> None:
    """A new run never writes over a run: a folder holding any checkpoint (`latest` or not) is resumed."""
    if holds_checkpoint(run_dir / "checkpoints"):
        tags = sorted(p.name for p in (run_dir / "checkpoints").glob("step_*"))
        held = f" (checkpoints up to {tags[-1]})" if tags else ""
        raise ConfigError(
            f"run.name: {run_dir} already holds a run{held}; resume it with `stare train --resume {run_dir}`, "
            f"or choose another run.name (--set run.name=NEW)"
        )


def _config_copy(checkpoints: Path) -> Path | None:
    """The run config saved with the newest checkpoint (learner.step.trainer.Learner.save), if any."""
    copies = sorted(checkpoints.glob("step_*/config.yaml"))
    return copies[-1] if copies else None


def _trained_steps(checkpoint: Path) -> int | None:
    """The step a verified checkpoint holds (None if its trainer_state.json does not say)."""
    import json

    try:
        return int(json.loads((checkpoint / "trainer_state.json").read_text(encoding="utf-8"))["step"])
    except (OSError, ValueError, KeyError, TypeError):
        return None  # the learner's load names what is wrong with it


_INPUT_PATHS = (
    ("model", "path"),
    ("task", "path"),
    ("task", "test_path"),
    ("system", "weight_dir"),
    ("control_plane", "token_file"),
    ("control", "token_file"),  # a config.yaml saved before the section was renamed
)


def _paths_against(raw: dict, run_dir: Path) -> dict:
    """The saved config with each relative input path that exists under `run_dir` made absolute."""

    def resolve(value):
        if isinstance(value, list):
            return [resolve(v) for v in value]
        if isinstance(value, str) and not Path(value).is_absolute() and (run_dir / value).exists():
            return str(run_dir / value)
        return value

    for section, key in _INPUT_PATHS:
        node = raw.get(section)
        if isinstance(node, dict) and node.get(key) is not None:
            node[key] = resolve(node[key])
    return raw


@contextmanager
def run_lock(run_dir: Path, *, resume: bool = False, say: Callable[[str], None] = print) -> Iterator[RunLock]:
    """One writer per run folder (stare.runtime.run_lock): a second `stare train`, a `stare up`, a learner
    of this run is refused with a line naming the holder. A new run checks again under the lock that the
    folder holds no run, and one that fails before it wrote anything (a bad dataset, a bad model folder)
    leaves no folder behind."""
    created = not run_dir.exists()
    try:
        with RunLock(run_dir, resume=resume, say=say) as lock:
            if not resume:
                refuse_existing_run(run_dir)
            yield lock
    except BaseException:
        if created and run_dir.is_dir() and [p.name for p in run_dir.iterdir()] == [".lock"]:
            shutil.rmtree(run_dir, ignore_errors=True)
        raise
