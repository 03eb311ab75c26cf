"""A damaged DeepSpeed checkpoint (real files of a real run): resume names the damaged file and
continues from the previous complete checkpoint, or stops naming it when none is complete."""

import json
import logging
import shutil

import pytest

from learner.engine.checkpoints import CheckpointError
from stare.app.launch.embedded import run_training
from stare.app.launch.run_folder import prepare_run
from stare.config import build_config

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def trained(tiny_model_dir, tmp_path_factory):
    """A 2-step run with a checkpoint after each step (step_000001, step_000002)."""
    from train_helpers import fast_override_list

    out = tmp_path_factory.mktemp("damage") / "runs"
    cfg = build_config({}, overrides=fast_override_list(tiny_model_dir, out) + ["control_plane.serve_in_train=false"])
    return run_training(prepare_run(cfg, None), progress=False)


def _steps(run_dir):
    return [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _copy(trained, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(trained, copy)
    return copy


def test_each_truncated_file_of_the_latest_checkpoint_resumes_from_the_previous_one(trained, tmp_path, caplog):
    names = sorted(p.name for p in (trained / "checkpoints" / "step_000002").iterdir())
    assert {"manifest.json", "trainer_state.json", "mp_rank_00_model_states.pt"} <= set(names)
    for name in names:
        run_dir = tmp_path / name
        shutil.copytree(trained, run_dir)
        damaged = run_dir / "checkpoints" / "step_000002" / name
        damaged.write_bytes(damaged.read_bytes()[: damaged.stat().st_size // 2])
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            run_training(prepare_run(None, run_dir, ["run.steps=3"]), resume=True, progress=False)
        warning = " ".join(r.getMessage() for r in caplog.records if "checkpoint damaged" in r.getMessage())
        assert f"checkpoint damaged: {damaged.resolve()}" in warning, name
        assert "resuming from the previous complete checkpoint" in warning and "step_000001" in warning
        assert _steps(run_dir) == [1, 2, 3], name  # step 2 trained again from step 1's checkpoint


def test_a_broken_latest_resumes_from_the_newest_complete_checkpoint(trained, tmp_path, caplog):
    run_dir = _copy(trained, tmp_path)
    (run_dir / "checkpoints" / "latest").write_bytes(b"\x00garbage")
    with caplog.at_level(logging.WARNING):
        run_training(prepare_run(None, run_dir, ["run.steps=3"]), resume=True, progress=False)
    assert any("latest: names" in r.getMessage() for r in caplog.records)
    assert _steps(run_dir) == [1, 2, 3]


def test_with_no_complete_checkpoint_resume_stops_naming_the_file_and_changes_nothing(trained, tmp_path):
    run_dir = _copy(trained, tmp_path)
    for tag in ("step_000001", "step_000002"):
        f = run_dir / "checkpoints" / tag / "mp_rank_00_model_states.pt"
        f.write_bytes(f.read_bytes()[:100])
    before = {p: p.read_bytes() for p in sorted(run_dir.rglob("*")) if p.is_file()}
    with pytest.raises(CheckpointError, match="step_000002/mp_rank_00_model_states.pt: 100 bytes, the manifest says"):
        run_training(prepare_run(None, run_dir, ["run.steps=3"]), resume=True, progress=False)
    assert {p: p.read_bytes() for p in sorted(run_dir.rglob("*")) if p.is_file()} == before
