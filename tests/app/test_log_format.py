"""Logs without a terminal: the step line's text and JSON forms, every N-th step (and the last),
the --log-format flag on train and the role commands, and end to end a non-TTY `stare train`
printing step lines whose numbers are the ones in metrics.jsonl (text and JSON)."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path

import pytest

from stare.app.cli import _load, _overrides, parse_args
from stare.observe.log_format import JsonFormatter, StepLines, format_step, step_record

METRICS = {
    "step": 12,
    "reward_mean": 0.4375,
    "entropy": 0.41234,
    "target": 0.3,
    "gate": True,
    "w": 1.2,
    "m": 0.8,
    "tokens_per_s": 912.4,
    "time_step_s": 1.234,
    "loss": 0.1,
}


def test_text_line_has_the_issues_fields():
    assert (
        format_step(step_record(METRICS, 150))
        == "step 12/150 reward 0.438 entropy 0.412/0.300 gate on W 1.20 M 0.80 tok/s 912 step 1.23s"
    )


def test_missing_fields_print_as_dashes_and_non_finite_as_null():
    record = step_record({"step": 1, "entropy": float("nan"), "reward_mean": 0.0, "time_step_s": 2.0}, 2)
    assert format_step(record) == "step 1/2 reward 0.000 entropy -/- gate - W - M - tok/s - step 2.00s"
    assert json.loads(json.dumps(record, allow_nan=False))["entropy"] is None


def test_distributed_fields_are_appended():
    line = format_step(step_record({**METRICS, "staleness_max": 1, "time_wait_data_s": 0.5}, 150))
    assert line.endswith("step 1.23s staleness 1 waited 0.50s")


def _captured_logger(name: str, formatter: logging.Formatter) -> tuple[logging.Logger, list[str]]:
    lines: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record):
            lines.append(self.format(record))

    logger = logging.getLogger(name)
    logger.handlers, logger.propagate = [], False
    handler = Keep()
    handler.setFormatter(formatter)
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    return logger, lines


def test_every_nth_step_and_the_last_are_logged():
    logger, lines = _captured_logger("test.steps.n", logging.Formatter("%(message)s"))
    lines_of = StepLines(every_n=3, total_steps=7, logger=logger)
    for step in range(1, 8):
        lines_of({**METRICS, "step": step})
    assert [line.split()[1] for line in lines] == ["3/7", "6/7", "7/7"]


def test_json_lines_carry_the_step_fields():
    logger, lines = _captured_logger("test.steps.json", JsonFormatter({"role": "learner"}))
    StepLines(every_n=1, total_steps=150, logger=logger)(dict(METRICS))
    (obj,) = [json.loads(line) for line in lines]
    assert obj["event"] == "step" and obj["role"] == "learner" and obj["level"] == "info"
    assert (obj["step"], obj["reward"], obj["gate"], obj["tokens_per_s"], obj["step_time_s"]) == (
        12,
        0.4375,
        1,
        912.4,
        1.234,
    )
    assert obj["message"] == format_step(step_record(METRICS, 150))


@pytest.mark.parametrize("command", ["train", "learner", "rollout", "reward"])
def test_log_format_flag_sets_the_config_field(command):
    args = parse_args([command, "--log-format", "json", "--set", "run.steps=3"])
    assert _overrides(args) == ["run.steps=3", "logging.format=json"]
    assert _load(args).logging.format == "json"
    assert _load(parse_args([command])).logging.format == "text"


def test_an_unknown_log_format_is_refused(capsys):
    with pytest.raises(SystemExit):
        parse_args(["train", "--log-format", "xml"])
    assert "--log-format" in capsys.readouterr().err


def _train(fast_overrides, name: str, *extra: str) -> tuple[str, list[dict]]:
    """A non-TTY `stare train` (stdout and stderr pipes); its stderr and metrics.jsonl."""
    from learner.engine.deepspeed_engine import child_env

    args = [sys.executable, "-m", "stare.app.cli", "train", *extra]
    for o in fast_overrides + [
        "run.steps=3",
        "logging.every_n_steps=2",
        f"run.name={name}",
        "control_plane.serve_in_train=false",
    ]:
        args += ["--set", o]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=600, env=child_env())
    assert proc.returncode == 0, proc.stderr[-3000:]
    out_dir = Path(next(o for o in fast_overrides if o.startswith("run.output_dir=")).split("=", 1)[1])
    metrics = [json.loads(line) for line in (out_dir / name / "metrics.jsonl").read_text().splitlines()]
    return proc.stderr, metrics


@pytest.mark.slow
def test_non_tty_train_prints_step_lines_every_n_steps(fast_overrides):
    err, metrics = _train(fast_overrides, "text-log")
    steps = [line for line in err.splitlines() if " step " in line and " reward " in line]
    assert len(steps) == 2, err[-3000:]
    for line, m in zip(steps, [metrics[1], metrics[2]]):  # steps 2 and 3 (every 2nd and the last)
        assert line.endswith(format_step(step_record(m, 3))), line
    assert any("checkpoint" in line for line in err.splitlines())


@pytest.mark.slow
def test_json_log_format_prints_parseable_step_objects(fast_overrides):
    err, metrics = _train(fast_overrides, "json-log", "--log-format", "json")
    objects = [json.loads(line) for line in err.splitlines() if line.startswith("{")]
    steps = [o for o in objects if o.get("event") == "step"]
    assert [o["step"] for o in steps] == [2, 3]
    for o in steps:
        m = metrics[o["step"] - 1]
        assert (o["reward"], o["entropy"], o["step_time_s"], o["run"]) == (
            m["reward_mean"],
            m["entropy"],
            m["time_step_s"],
            "json-log",
        )
    assert any("checkpoint" in o["message"] for o in objects)
    assert not [line for line in err.splitlines() if "step 2/3" in line and not line.startswith("{")]


@pytest.mark.redis
@pytest.mark.skipif(not __import__("redis_fixtures").have_redis_server(), reason="redis-server is not installed")
def test_a_role_started_with_log_format_json_logs_json_objects_with_its_name(tmp_path):
    """`stare reward --log-format json` against a real redis-server: its log lines are JSON objects
    naming the role and the worker (read until its first line, then SIGTERM)."""
    import signal

    from redis_fixtures import redis_server

    from learner.engine.deepspeed_engine import child_env

    with redis_server(tmp_path / "redis") as server:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "stare.app.cli",
                "reward",
                "--log-format",
                "json",
                "--redis-url",
                server.url,
                "--name",
                "reward-json",
                "--set",
                f"run.output_dir={tmp_path}",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=child_env(),
        )
        try:
            first = proc.stderr.readline()  # the role logs its start before it waits for work
            proc.send_signal(signal.SIGTERM)
            _, rest = proc.communicate(timeout=120)
        finally:
            if proc.poll() is None:
                proc.kill()
    lines = [line for line in (first + rest).splitlines() if line.strip()]
    ours = [json.loads(line) for line in lines if line.startswith("{")]
    assert ours and len(ours) == len(lines), lines
    assert {(o["role"], o["name"]) for o in ours} == {("reward", "reward-json")}
    assert all(o["level"] in ("info", "warning") and o["message"] for o in ours)
