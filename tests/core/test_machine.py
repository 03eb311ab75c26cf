"""stare.observe.machine: the run's machine record (model hash, torch kernels, packages)."""

import hashlib
import json

import torch

from stare.observe.machine import fingerprint, model_digest


def test_model_digest_hashes_relative_names_and_bytes_in_sorted_order(tmp_path):
    (tmp_path / "b.bin").write_bytes(b"\x00\x01")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "a.json").write_text("{}")
    h = hashlib.sha256()
    for name, data in (("b.bin", b"\x00\x01"), ("sub/a.json", b"{}")):
        h.update(name.encode() + b"\0" + data)
    assert model_digest(tmp_path) == {"path": str(tmp_path), "sha256": h.hexdigest(), "files": 2, "bytes": 4}


def test_one_changed_byte_changes_the_digest(tmp_path):
    (tmp_path / "w.bin").write_bytes(b"\x00" * 16)
    before = model_digest(tmp_path)["sha256"]
    (tmp_path / "w.bin").write_bytes(b"\x00" * 15 + b"\x01")
    assert model_digest(tmp_path)["sha256"] != before


def test_fingerprint_reports_this_process_torch_build_and_is_json(tmp_path):
    record = fingerprint(None)
    assert record["model"] == {"path": None, "sha256": None}
    assert record["torch"]["version"] == torch.__version__
    assert record["torch"]["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert record["torch"]["threads"] == torch.get_num_threads()
    assert record["packages"]["torch"] is not None
    json.dumps(record)


def test_the_build_log_is_not_part_of_the_digest(tmp_path):
    """Two builds of the same weights differ only in build_info.json's wall times: one fingerprint."""
    (tmp_path / "model.safetensors").write_bytes(b"\x00" * 16)
    (tmp_path / "build_info.json").write_text(json.dumps({"train_seconds": 37.3}))
    before = model_digest(tmp_path)["sha256"]
    (tmp_path / "build_info.json").write_text(json.dumps({"train_seconds": 41.9}))
    assert model_digest(tmp_path)["sha256"] == before
