"""Which checkpoint a resume loads (learner.engine.checkpoints): `latest`'s when its files match its
manifest, else the newest older whole one with a warning naming the damaged file, else an error
naming it. Real files; the DeepSpeed checkpoints themselves: tests/app/test_checkpoint_damage.py."""

from __future__ import annotations

import hashlib
import json

import pytest

from learner.engine.checkpoints import CheckpointError, choose_checkpoint, damage, write_manifest


def _tag(root, name, *, manifest=True, state=True):
    (root / name).mkdir(parents=True)
    (root / name / "mp_rank_00_model_states.pt").write_bytes(b"weights" * 100)
    if state:
        (root / name / "trainer_state.json").write_text("{}")
    if manifest:
        write_manifest(root / name)


def _choose(root, **kw):
    said: list[str] = []
    return choose_checkpoint(root, said.append, **kw), said


def test_the_manifest_records_each_file_size_and_sha256_read_from_disk(tmp_path):
    _tag(tmp_path, "step_000001")
    files = json.loads((tmp_path / "step_000001" / "manifest.json").read_text())["files"]
    assert files["mp_rank_00_model_states.pt"] == {"size": 700, "sha256": hashlib.sha256(b"weights" * 100).hexdigest()}
    assert set(files) == {"mp_rank_00_model_states.pt", "trainer_state.json"}


def test_latest_names_a_whole_checkpoint(tmp_path):
    _tag(tmp_path, "step_000010")
    _tag(tmp_path, "step_000020")
    (tmp_path / "latest").write_text("step_000010")
    assert _choose(tmp_path) == ("step_000010", [])


def test_a_checkpoint_killed_before_its_manifest_is_skipped_without_a_warning_when_latest_is_older(tmp_path):
    _tag(tmp_path, "step_000010")
    _tag(tmp_path, "step_000020", manifest=False)  # DeepSpeed's files and trainer_state written, then the kill
    (tmp_path / "latest").write_text("step_000010")
    assert _choose(tmp_path) == ("step_000010", [])


@pytest.mark.parametrize("name", ["mp_rank_00_model_states.pt", "trainer_state.json"])
def test_a_truncated_file_of_latest_falls_back_to_the_previous_checkpoint_naming_the_file(tmp_path, name):
    _tag(tmp_path, "step_000010")
    _tag(tmp_path, "step_000020")
    (tmp_path / "latest").write_text("step_000020")
    damaged = tmp_path / "step_000020" / name
    damaged.write_bytes(damaged.read_bytes()[:1])
    tag, said = _choose(tmp_path)
    assert tag == "step_000010"
    assert len(said) == 1 and f"checkpoint damaged: {damaged}: 1 bytes, the manifest says" in said[0]


def test_a_flipped_byte_is_caught_by_the_digest_and_not_by_size_only_verification(tmp_path):
    _tag(tmp_path, "step_000010")
    f = tmp_path / "step_000010" / "mp_rank_00_model_states.pt"
    f.write_bytes(b"X" + f.read_bytes()[1:])  # same size
    assert "contents differ from the manifest" in damage(tmp_path / "step_000010")
    assert damage(tmp_path / "step_000010", verify="size") is None


@pytest.mark.parametrize("manifest", ["{not json", '{"files": {}}', '{"files": [1]}', ""])
def test_a_broken_manifest_counts_as_damage(tmp_path, manifest):
    _tag(tmp_path, "step_000010")
    _tag(tmp_path, "step_000020")
    (tmp_path / "latest").write_text("step_000020")
    (tmp_path / "step_000020" / "manifest.json").write_text(manifest)
    tag, said = _choose(tmp_path)
    assert tag == "step_000010" and f"{tmp_path / 'step_000020' / 'manifest.json'}: unreadable" in said[0]


@pytest.mark.parametrize("latest", [b"step_000099", b"../../etc", b"\xff\xfe", None])
def test_a_broken_latest_falls_back_to_the_newest_whole_checkpoint_with_a_warning(tmp_path, latest):
    _tag(tmp_path, "step_000010")
    _tag(tmp_path, "step_000020")
    if latest is not None:
        (tmp_path / "latest").write_bytes(latest)
    tag, said = _choose(tmp_path)
    assert tag == "step_000020" and f"{tmp_path / 'latest'}: " in said[0]


def test_no_whole_checkpoint_is_an_error_naming_the_damaged_file(tmp_path):
    _tag(tmp_path, "step_000010")
    (tmp_path / "latest").write_text("step_000010")
    (tmp_path / "step_000010" / "trainer_state.json").unlink()
    with pytest.raises(
        CheckpointError,
        match=f"{tmp_path / 'step_000010' / 'trainer_state.json'}: missing; no other complete checkpoint",
    ):
        _choose(tmp_path)


def test_a_folder_from_before_manifests_resumes_by_trainer_state_as_before(tmp_path):
    _tag(tmp_path, "step_000010", manifest=False)
    _tag(tmp_path, "step_000020", manifest=False, state=False)  # killed while DeepSpeed wrote
    (tmp_path / "latest").write_text("step_000020")
    tag, said = _choose(tmp_path)
    assert tag == "step_000010" and "trainer_state.json: missing" in said[0]


def test_an_old_checkpoint_without_manifest_is_the_fallback_of_a_newer_damaged_one(tmp_path):
    _tag(tmp_path, "step_000010", manifest=False)  # written before manifests
    _tag(tmp_path, "step_000020")  # the resumed run's, with one
    (tmp_path / "latest").write_text("step_000020")
    (tmp_path / "step_000020" / "trainer_state.json").write_text("")
    tag, said = _choose(tmp_path)
    assert tag == "step_000010" and "step_000020/trainer_state.json: 0 bytes" in said[0]
