"""The run folder of `stare train`: a new run never overwrites an old one, a resumed one is the folder
named wherever it lives now (relative input paths resolved against it), and one process at a time
holds it (`run_lock`)."""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path

from stare.config import ConfigError, TrainConfig, build_config


def prepare_run(cfg: TrainConfig | None, resume: Path | None, overrides: list[str] = ()) -> TrainConfig:
    """The config of a new run (refusing to overwrite one) or of the run to resume.

    A resumed run is the folder named, wherever it lives now: its saved run.output_dir/run.name are
    history, and relative paths in its config.yaml resolve against the folder first (then the
    working directory, where runs started before this rule pointed)."""
    if resume is not None:
        from learner.engine.checkpoints import require_checkpoint

        run_dir = Path(resume).resolve()
        resumed = read_run_config(run_dir, "--resume", overrides)
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
    if (cfg.run_dir / "checkpoints" / "latest").exists():
        raise ConfigError(
            f"run.name: {cfg.run_dir} already holds a run; resume it with `stare train --resume {cfg.run_dir}` "
            f"or choose another name with --set run.name=NEW"
        )
    return cfg


def read_run_config(run_dir: Path, flag: str, overrides: list[str] | tuple[str, ...] = ()) -> TrainConfig:
    """The config a run folder was written with (its config.yaml, relative input paths resolved against the
    folder), its run folder set to `run_dir`; nothing else is checked (no checkpoint, no lock): what a resume
    and an export of any checkpoint both read. `flag` names the command's argument in errors."""
    from stare.config.files import read_yaml_mapping

    run_dir = Path(run_dir).resolve()
    saved = run_dir / "config.yaml"
    if not saved.is_file():
        raise ConfigError(f"{flag} {run_dir}: no config.yaml there; pass a run folder written by `stare train`")
    cfg = build_config(_paths_against(read_yaml_mapping(saved), run_dir), overrides=overrides)
    cfg._run_dir = run_dir
    return cfg


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
def run_lock(run_dir: Path):
    """One process per run folder: a second `stare train` on the same run fails at once. A new run
    that fails before it wrote anything (a bad dataset, a bad model folder) leaves no folder behind."""
    import fcntl
    import shutil

    created = not run_dir.exists()
    run_dir.mkdir(parents=True, exist_ok=True)
    try:
        with open(run_dir / ".lock", "w") as handle:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise ConfigError(
                    f"run.name: {run_dir} is in use by another stare process; choose another run.name"
                ) from None
            handle.write(str(__import__("os").getpid()))
            handle.flush()
            yield
    except BaseException:
        if created and [p.name for p in run_dir.iterdir()] == [".lock"]:
            shutil.rmtree(run_dir, ignore_errors=True)
        raise
