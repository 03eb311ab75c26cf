"""Faults of the machine under a real `stare train`, each one line (exit 2, no traceback) that names the
file and what to do, and nothing of the run lost:

* a full disk while a checkpoint is written (a real ENOSPC: the run folder on a small tmpfs) names the
  checkpoint and the last complete one, which stays `latest`; the partial folder is removed;
* a resume on a full disk leaves config.yaml whole (it was truncated to nothing, and the next resume then
  trained the built-in defaults);
* a read-only run folder (a read-only bind mount) says so;
* a model of another shape on resume names the differing fields and never advises deleting the intact
  checkpoint;
* SIGTERM during start-up stops the start at once: no evaluation, no checkpoint.

The mounts live in a private mount namespace of the command (tests/small_disks.py)."""

from __future__ import annotations

import hashlib
import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import small_disks
from train_helpers import fast_override_list

from learner.engine.deepspeed_engine import child_env
from stare.app.cli import main

pytestmark = pytest.mark.slow

STARE = [sys.executable, "-m", "stare.app.cli"]


def _fast(tiny: Path, out: Path, name: str, *extra: str) -> list[str]:
    flags = ["--no-progress", "--set", "control_plane.serve_in_train=false"]
    return flags + [w for o in [*fast_override_list(tiny, out), f"run.name={name}", *extra] for w in ("--set", o)]


def _snapshot(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.name != ".lock"
    }


def _one_line(stderr: str) -> str:
    """The `stare:` line of a mapped mistake (the second says how to see its traceback)."""
    assert "Traceback" not in stderr, stderr[-3000:]
    lines = [line for line in stderr.splitlines() if line.startswith("stare: ")]
    assert len(lines) == 2 and lines[1] == "stare: (--debug or STARE_DEBUG=1 shows where it was raised)", stderr[-3000:]
    return lines[0]


@pytest.fixture
def mounts():
    why = small_disks.available()
    if why is not None:
        pytest.skip(why)


def test_a_full_disk_during_a_checkpoint_names_it_and_keeps_the_last_complete_one(tmp_path, tiny_model_dir, mounts):
    disk, after = tmp_path / "disk", tmp_path / "after"
    weights = (tiny_model_dir / "model.safetensors").stat().st_size
    # a checkpoint (fp32 weights + Adam's two moments + the engine's copy) is ~4x the weights: the first one
    # fits in 6x, the second does not
    done = small_disks.run_with_mount(
        [*STARE, "train", *_fast(tiny_model_dir, disk, "full", "run.steps=3")],
        disk,
        size_kib=6 * weights // 1024,
        copy_out=after,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2, done.stderr[-3000:]
    ckpts = disk / "full" / "checkpoints"
    assert _one_line(done.stderr) == (
        f"stare: disk full writing {ckpts / 'step_000002'}; the last complete checkpoint is step 1 "
        f"({ckpts / 'step_000001'}); free space on that disk, then resume: stare train --resume {disk / 'full'}"
    )
    left = after / "full" / "checkpoints"
    assert (left / "latest").read_text() == "step_000001"
    assert not (left / "step_000002").exists()  # the partial checkpoint gave its space back
    assert json.loads((left / "step_000001" / "trainer_state.json").read_text())["step"] == 1


def test_a_resume_on_a_full_disk_leaves_its_config_whole(tmp_path, tiny_model_dir, mounts):
    out = tmp_path / "runs"
    assert main(["train", *_fast(tiny_model_dir, out, "r", "run.steps=1")]) == 0
    config = (out / "r" / "config.yaml").read_bytes()
    after = tmp_path / "after"
    # the disk: the run, then a filler up to the last page, so that the lock's record still fits
    fill = f"dd if=/dev/zero of={out}/filler bs=4k 2>/dev/null; truncate -s -4096 {out}/filler; "
    done = small_disks.run_with_mount(
        [
            "sh",
            "-c",
            fill + " ".join([*STARE, "train", "--no-progress", "--resume", str(out / "r"), "--set", "run.steps=2"]),
        ],
        out,
        size_kib=2 * sum(p.stat().st_size for p in out.rglob("*") if p.is_file()) // 1024 + 1024,
        copy_out=after,
        capture_output=True,
        text=True,
        env=child_env(),  # not this process's process-group variables (the run above formed a group here)
    )
    assert done.returncode == 2, done.stderr[-3000:]
    assert _one_line(done.stderr).startswith("stare: disk full writing ")
    assert "the last complete checkpoint is step 1" in done.stderr
    assert (after / "r" / "config.yaml").read_bytes() == config  # whole: not truncated, not half-written


def test_a_read_only_run_folder_is_one_line(tmp_path, tiny_model_dir, mounts):
    out = tmp_path / "runs"
    assert main(["train", *_fast(tiny_model_dir, out, "r", "run.steps=1")]) == 0
    before = _snapshot(out / "r")
    done = small_disks.run_with_mount(
        [*STARE, "train", "--no-progress", "--resume", str(out / "r"), "--set", "run.steps=2"],
        out / "r",
        read_only=True,
        capture_output=True,
        text=True,
        env=child_env(),
    )
    assert done.returncode == 2, done.stderr[-3000:]
    assert _one_line(done.stderr) == (
        f"stare: run folder {out / 'r'} is on a read-only file system: a run writes its lock, logs and checkpoints "
        "there; copy it to a writable disk and resume the copy (stare train --resume COPY)"
    )
    assert _snapshot(out / "r") == before


def _other_shape(tiny: Path, out: Path) -> Path:
    """The tiny model with half the hidden size (random weights), its tokenizer files copied."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(tiny)
    config.hidden_size, config.intermediate_size = config.hidden_size // 2, config.intermediate_size // 2
    AutoModelForCausalLM.from_config(config).save_pretrained(out)
    for f in tiny.iterdir():
        if f.name.startswith(("tokenizer", "generation_config", "special_tokens")):
            shutil.copy(f, out / f.name)
    return out


def test_a_model_of_another_shape_names_the_fields_and_keeps_the_checkpoint(tmp_path, tiny_model_dir, capsys):
    out = tmp_path / "runs"
    assert main(["train", *_fast(tiny_model_dir, out, "r", "run.steps=1")]) == 0
    other = _other_shape(tiny_model_dir, tmp_path / "smaller")
    hidden = json.loads((tiny_model_dir / "config.json").read_text())["hidden_size"]
    capsys.readouterr()
    before = _snapshot(out / "r" / "checkpoints")
    code = main(
        ["train", "--no-progress", "--resume", str(out / "r"), "--set", "run.steps=2", "--set", f"model.path={other}"]
    )
    err = capsys.readouterr().err
    assert code == 2
    line = _one_line(err)
    assert f"stare: {out / 'r' / 'checkpoints' / 'step_000001'} holds a model of another shape than this run's" in line
    assert f"hidden_size {hidden} -> {hidden // 2}" in line
    assert f"model.path {tiny_model_dir} -> {other}" in line
    assert (
        f"the checkpoint is intact; resume with the model it was trained with (--set model.path={tiny_model_dir})"
        in line
    )
    assert "delete" not in line
    assert _snapshot(out / "r" / "checkpoints") == before


def test_sigterm_during_start_up_stops_at_once_with_nothing_saved(tmp_path, tiny_model_dir):
    out = tmp_path / "runs"
    proc = subprocess.Popen(
        [*STARE, "train", *_fast(tiny_model_dir, out, "s")],
        stderr=subprocess.PIPE,
        text=True,
        env={**child_env(), "PYTHONUNBUFFERED": "1"},
    )
    lock = out / "s" / ".lock"
    deadline = time.monotonic() + 120
    while not (lock.exists() and lock.stat().st_size):  # the lock is the first thing a start takes
        assert proc.poll() is None and time.monotonic() < deadline, "the run never took its lock"
        time.sleep(0.01)
    proc.send_signal(signal.SIGTERM)
    t0 = time.monotonic()
    _, err = proc.communicate(timeout=60)
    assert time.monotonic() - t0 < 20, "the signal waited for the start to finish"
    assert proc.returncode == 0, err[-3000:]
    assert "stopped by SIGTERM during start-up: nothing trained; start it again" in err and "Traceback" not in err
    assert not (out / "s" / "checkpoints").exists() and not (out / "s" / "eval.jsonl").exists()
