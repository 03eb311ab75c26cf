"""`--resume DIR` resumes the folder named: a moved copy, from another working directory, with the
default relative output_dir, continues the copy and leaves the original byte-identical."""

import hashlib
import json
import shutil
from pathlib import Path

import pytest

from stare.app.launch.embedded import run_training
from stare.app.launch.run_folder import prepare_run
from stare.config import build_config

COMPARED = ("loss", "entropy", "reward_mean", "gate", "w", "m", "clip_fraction", "grad_norm", "response_length_mean")


def _snapshot(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.slow
def test_resuming_a_moved_copy_from_another_directory_continues_the_copy_only(fast_overrides, tmp_path, monkeypatch):
    common = fast_overrides + ["run.steps=3"]
    straight = run_training(
        prepare_run(build_config({}, overrides=common + ["run.name=straight"]), None), progress=False
    )
    started_in, elsewhere = tmp_path / "started", tmp_path / "elsewhere"
    started_in.mkdir()
    elsewhere.mkdir()
    monkeypatch.chdir(started_in)
    first = run_training(
        prepare_run(build_config({}, overrides=common + ["run.output_dir=runs", "run.name=a", "run.steps=1"]), None),
        progress=False,
    )
    assert first == Path("runs/a")  # relative: the default output_dir
    original = started_in / first
    copy = tmp_path / "backup" / "a-copy"  # moved and renamed
    shutil.copytree(original, copy)
    before = _snapshot(original)

    monkeypatch.chdir(elsewhere)
    resumed = run_training(prepare_run(None, Path("../backup/a-copy"), ["run.steps=3"]), resume=True, progress=False)

    assert resumed == copy.resolve()
    assert _snapshot(original) == before  # nothing of the original touched
    assert list(elsewhere.iterdir()) == []  # no stray runs/<name> or .lock where the resume ran
    a, b = _lines(straight / "metrics.jsonl"), _lines(copy / "metrics.jsonl")
    assert [m["step"] for m in b] == [1, 2, 3]
    for ma, mb in zip(a, b):
        for key in COMPARED:
            assert mb[key] == pytest.approx(ma[key], rel=1e-5, abs=1e-7), (ma["step"], key)
    assert (copy / "checkpoints" / "latest").read_text() == "step_000003"
    saved = build_config(__import__("yaml").safe_load((copy / "config.yaml").read_text()))
    assert (saved.run.output_dir, saved.run.name) == (Path("runs"), "a")  # history, not a destination


def test_relative_paths_in_a_run_folders_config_resolve_against_the_folder(tiny_model_dir, tmp_path, monkeypatch):
    from learner.engine.checkpoints import write_manifest

    run = tmp_path / "moved" / "r"
    shutil.copytree(tiny_model_dir, run / "model")  # a self-contained run folder: its model inside it
    (run / "config.yaml").write_text("run:\n  name: r\n  output_dir: runs\nmodel:\n  path: model\n")
    step = run / "checkpoints" / "step_000001"
    step.mkdir(parents=True)
    (step / "trainer_state.json").write_text("{}")
    write_manifest(step)
    (run / "checkpoints" / "latest").write_text("step_000001")
    monkeypatch.chdir(tmp_path)  # neither the folder nor where it was started
    cfg = prepare_run(None, Path("moved/r"), ["task.eval_k=3"])
    assert cfg.model.path == run.resolve() / "model" and cfg.run_dir == run.resolve()
    assert cfg.task.eval_k == 3  # --set still applies on top
