"""Log lines for logs without a terminal: one compact line per N training steps, as text or as one
JSON object per line for log shippers (`logging.format`, `--log-format json`).

    step 12/150 reward 0.438 entropy 0.412/0.300 gate on W 1.20 M 0.80 tok/s 912 step 1.23s
    {"ts": 1764590000.1, "level": "info", "logger": "stare.steps", "message": "step 12/150 ...",
     "event": "step", "step": 12, "steps": 150, "reward": 0.438, "entropy": 0.412, "target": 0.3, ...}

`setup(fmt, text_format)` points the root logger at stderr with the text or the JSON formatter
(the role processes); `train_logger` is `stare train`'s logger without a terminal; `StepLines`
logs every N-th step through a logger (default "stare.steps").
"""

from __future__ import annotations

import json
import logging
import math
import sys
from typing import Any, TextIO

STEP_LOGGER = "stare.steps"
# step record field -> metrics.jsonl key
STEP_FIELDS = {
    "reward": "reward_mean",
    "entropy": "entropy",
    "target": "target",
    "gate": "gate",
    "w": "w",
    "m": "m",
    "tokens_per_s": "tokens_per_s",
    "step_time_s": "time_step_s",
    "staleness_max": "staleness_max",
    "wait_data_s": "time_wait_data_s",
}


def _finite(value: Any) -> Any:
    """JSON has no NaN/inf: those become null (a non-finite entropy shows as null, not as invalid JSON)."""
    return None if isinstance(value, float) and not math.isfinite(value) else value


def step_record(metrics: dict[str, Any], total_steps: int) -> dict[str, Any]:
    """The fields of a step line (None where the step did not log the key, e.g. target for GRPO)."""
    record: dict[str, Any] = {"event": "step", "step": int(metrics["step"]), "steps": total_steps}
    record.update({name: _finite(metrics.get(key)) for name, key in STEP_FIELDS.items()})
    if record["gate"] is not None:
        record["gate"] = int(record["gate"])
    return record


def _num(value: Any, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def format_step(r: dict[str, Any]) -> str:
    """One compact text line of a step record."""
    gate = "-" if r["gate"] is None else ("on" if r["gate"] else "off")
    line = (
        f"step {r['step']}/{r['steps']} reward {_num(r['reward'], '.3f')} entropy {_num(r['entropy'], '.3f')}/"
        f"{_num(r['target'], '.3f')} gate {gate} W {_num(r['w'], '.2f')} M {_num(r['m'], '.2f')} "
        f"tok/s {_num(r['tokens_per_s'], '.0f')} step {_num(r['step_time_s'], '.2f')}s"
    )
    if r.get("staleness_max") is not None:
        line += f" staleness {r['staleness_max']}"
    if r.get("wait_data_s") is not None:
        line += f" waited {r['wait_data_s']:.2f}s"
    return line


class JsonFormatter(logging.Formatter):
    """One JSON object per record: ts, level, logger, message, the record's `fields` (extra=) and the
    exception text, if any."""

    def __init__(self, static: dict[str, Any] | None = None):
        super().__init__()
        self.static = static or {}

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": round(record.created, 3),
            "level": record.levelname.lower(),
            "logger": record.name,
            **self.static,
            "message": record.getMessage(),
        }
        out.update(getattr(record, "fields", None) or {})
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str, allow_nan=False)


def setup(fmt: str, text_format: str, *, static: dict[str, Any] | None = None, level: int = logging.INFO) -> None:
    """The root logger on stderr: `text_format` (a logging format string) or JSON with `static` fields."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter(static) if fmt == "json" else logging.Formatter(text_format))
    logging.basicConfig(level=level, handlers=[handler], force=True)


class _TrainHandler(logging.StreamHandler[TextIO]):
    """The handler `train_logger` installs (so a second call replaces it)."""


def train_logger(fmt: str, run_name: str) -> logging.Logger:
    """`stare train`'s logger without a terminal: "stare.train" on stderr, text with a timestamp or JSON
    with the run name; its own handler (the root logger, which a host program may own, is left alone)."""
    logger = logging.getLogger("stare.train")
    for old in [h for h in logger.handlers if isinstance(h, _TrainHandler)]:
        logger.removeHandler(old)
    handler = _TrainHandler(sys.stderr)
    handler.setFormatter(
        JsonFormatter({"run": run_name}) if fmt == "json" else logging.Formatter("%(asctime)s %(message)s")
    )
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    return logger


class StepLines:
    """Logs every `every_n`-th step (and the last) as a step line, with the record as JSON fields."""

    def __init__(self, every_n: int, total_steps: int, logger: logging.Logger | None = None):
        self.every_n, self.total_steps = every_n, total_steps
        self.logger = logger or logging.getLogger(STEP_LOGGER)

    def __call__(self, metrics: dict[str, Any]) -> None:
        step = int(metrics["step"])
        if step % self.every_n == 0 or step == self.total_steps:
            record = step_record(metrics, self.total_steps)
            self.logger.info(format_step(record), extra={"fields": record})
