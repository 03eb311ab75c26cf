"""Files a run rewrites are replaced whole (stare.observe.files.write_atomic), and the append-only logs are
read tolerantly: a damaged line is skipped with a warning naming the file and its line, never taking the
lines after it along (read_jsonl, cut_jsonl, the resume of RunOutputs, the report)."""

from __future__ import annotations

import json
import logging

from stare.config import build_config
from stare.observe.files import cut_jsonl, read_jsonl, write_atomic
from stare.observe.run_outputs import RunOutputs

DAMAGED = b'{"step": 2, "rew'  # a line cut short by a crash


def _jsonl(path, *lines: bytes, end: bytes = b"\n") -> None:
    path.write_bytes(b"\n".join(lines) + end)


def _steps(path) -> list[int]:
    return [json.loads(line)["step"] for line in path.read_text().splitlines()]


def test_write_atomic_replaces_the_file_by_rename_and_leaves_no_temporary(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text("old")
    inode = path.stat().st_ino
    write_atomic(path, "new: 1\n")
    assert path.read_text() == "new: 1\n"
    assert path.stat().st_ino != inode  # a new file renamed over the old one, not the old one rewritten in place
    assert [p.name for p in tmp_path.iterdir()] == ["config.yaml"]


def test_a_failed_write_atomic_leaves_the_old_file_whole(tmp_path):
    path = tmp_path / "latest"
    path.write_text("step_000010")

    class Unwritable:  # not bytes: the write fails after the temporary file was opened
        pass

    try:
        write_atomic(path, Unwritable())  # type: ignore[arg-type]
    except (TypeError, AttributeError):
        pass
    assert path.read_text() == "step_000010"
    assert [p.name for p in tmp_path.iterdir()] == ["latest"]


def test_read_jsonl_skips_damaged_lines_anywhere_with_a_warning_naming_each(tmp_path):
    path = tmp_path / "metrics.jsonl"
    _jsonl(path, b'{"step": 1}', DAMAGED, b"\xff\xfe", b"[1, 2]", b"", b'{"step": 5}', b'{"step": 6')
    warnings: list[str] = []
    assert read_jsonl(path, warnings.append) == [{"step": 1}, {"step": 5}]
    assert warnings == [
        f"warning: {path} line 2: not valid JSON (Unterminated string starting at); skipped",
        f"warning: {path} line 3: not UTF-8 (byte 0xff at column 1); skipped",
        f"warning: {path} line 4: not a JSON object (a list); skipped",
        f"warning: {path} line 7: not valid JSON (Expecting ',' delimiter); skipped",  # newline-terminated: damaged
    ]


def test_read_jsonl_skips_an_unfinished_last_line_silently(tmp_path):
    path = tmp_path / "metrics.jsonl"
    _jsonl(path, b'{"step": 1}', b'{"step": 2, "rew', end=b"")  # no newline yet: being written
    warnings: list[str] = []
    assert read_jsonl(path, warnings.append) == [{"step": 1}] and warnings == []


def test_cut_jsonl_keeps_every_step_up_to_the_resume_and_moves_damaged_lines_aside(tmp_path):
    path = tmp_path / "metrics.jsonl"
    _jsonl(path, b'{"step": 1}', DAMAGED, b'{"step": 3}', b"\xff", b'{"step": 4}', b'{"no": "step"}', b'{"step": 5')
    warnings: list[str] = []
    cut_jsonl(path, 3, warnings.append)
    assert _steps(path) == [1, 3]  # 4 and the torn 5 come again after the resume; 3 is never lost
    assert (tmp_path / "metrics.jsonl.damaged").read_bytes() == DAMAGED + b"\n\xff\n" + b'{"no": "step"}\n{"step": 5\n'
    assert [w.split(": ", 2)[1] for w in warnings] == [f"{path} line {n}" for n in (2, 4, 6, 7)]
    assert all(w.endswith("moved to metrics.jsonl.damaged") for w in warnings)


def test_a_resumed_run_keeps_the_steps_after_a_damaged_line(tmp_path, caplog):
    """The defect: one damaged line of metrics.jsonl dropped every later line on resume, silently."""
    cfg = build_config({"run": {"name": "r", "output_dir": str(tmp_path)}})
    cfg.run_dir.mkdir(parents=True)
    _jsonl(cfg.run_dir / "metrics.jsonl", *[b'{"step": %d}' % s if s != 2 else DAMAGED for s in range(1, 7)])
    _jsonl(cfg.run_dir / "eval.jsonl", b'{"step": 0}', b"\xfe", b'{"step": 4}', b'{"step": 6}')
    with caplog.at_level(logging.WARNING):
        outputs = RunOutputs(cfg, resume_step=4)
        outputs.close()
    assert _steps(cfg.run_dir / "metrics.jsonl") == [1, 3, 4]
    assert _steps(cfg.run_dir / "eval.jsonl") == [0, 4]
    assert f"{cfg.run_dir / 'metrics.jsonl'} line 2: not valid JSON" in caplog.text
    assert f"{cfg.run_dir / 'eval.jsonl'} line 2: not UTF-8 (byte 0xfe at column 1)" in caplog.text


def test_the_config_of_a_resumed_run_is_replaced_not_rewritten_in_place(tmp_path):
    cfg = build_config({"run": {"name": "r", "output_dir": str(tmp_path)}})
    cfg.run_dir.mkdir(parents=True)
    (cfg.run_dir / "config.yaml").write_text("run: {name: r}\n")
    inode = (cfg.run_dir / "config.yaml").stat().st_ino
    RunOutputs(cfg, resume_step=0).close()
    assert (cfg.run_dir / "config.yaml").stat().st_ino != inode
    assert build_config(__import__("yaml").safe_load((cfg.run_dir / "config.yaml").read_text())) == cfg


def test_the_report_reads_past_a_damaged_line(tmp_path, caplog):
    from stare.app.report import load_jsonl

    path = tmp_path / "metrics.jsonl"
    _jsonl(path, b'{"step": 1}', b"{oops", b'{"step": 3}')
    with caplog.at_level(logging.WARNING):
        assert load_jsonl(path) == [{"step": 1}, {"step": 3}]
    assert f"{path} line 2: not valid JSON" in caplog.text
