"""A learner killed while writing a checkpoint resumes from the last whole one."""

from __future__ import annotations

import pytest

from stare.learner.trainer import latest_whole_tag


def _tag(root, name, whole=True):
    (root / name).mkdir()
    (root / name / "mp_rank_00_model_states.pt").write_bytes(b"partial")
    if whole:
        (root / name / "trainer_state.json").write_text("{}")


def test_latest_names_a_whole_checkpoint(tmp_path):
    _tag(tmp_path, "step_000010")
    _tag(tmp_path, "step_000020")
    (tmp_path / "latest").write_text("step_000010")
    assert latest_whole_tag(tmp_path) == "step_000010"


def test_a_checkpoint_killed_before_its_trainer_state_is_skipped(tmp_path):
    _tag(tmp_path, "step_000010")
    _tag(tmp_path, "step_000020", whole=False)  # DeepSpeed's files written, then the kill
    (tmp_path / "latest").write_text("step_000020")  # as DeepSpeed's own save_latest would have left it
    assert latest_whole_tag(tmp_path) == "step_000010"


def test_no_whole_checkpoint_is_a_clear_error(tmp_path):
    _tag(tmp_path, "step_000010", whole=False)
    with pytest.raises(FileNotFoundError, match="no whole checkpoint"):
        latest_whole_tag(tmp_path)
