"""Weights & Biases logging of a run (`logging.wandb`; the optional extra `stare[wandb]`).

`WandbLogger.open(cfg, new=...)` starts (or, on `--resume`, continues) one W&B run per run
folder; its id is kept in `<run_dir>/wandb-run-id` so a resumed run continues the same W&B run.
`log_step` logs every metrics.jsonl field at the step (nested dicts flattened with "/":
`staleness_hist/0`; None, which means "not measured this step", is left out), `log_eval` the
held-out results under `eval/`, `log_report` the report's figures under `report/` and its summary
as a file. Offline mode writes under WANDB_DIR, else the run folder (`wandb sync` uploads later).
"""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path
from types import ModuleType
from typing import Any

from stare.config import ConfigError, TrainConfig
from stare.observe.files import write_atomic

ID_FILE = "wandb-run-id"
INIT_TIMEOUT_S = 120  # wandb.init's own limit (the service start, the server handshake online)


def flatten(record: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """{"a": {"b": 1}, "c": None} -> {"a/b": 1}: the form W&B charts; None (not measured) left out."""
    out: dict[str, Any] = {}
    for key, value in record.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flatten(value, f"{name}/"))
        elif value is not None:
            out[name] = value
    return out


def _import_wandb() -> ModuleType:
    try:
        import wandb
    except ImportError:
        raise ConfigError(
            "logging.wandb is set but wandb is not installed: pip install 'stare[wandb]' "
            "(or remove logging.wandb from the config)"
        ) from None
    return wandb


class WandbLogger:
    def __init__(self, run: Any, wandb: Any):
        self.run, self._wandb = run, wandb

    @classmethod
    def open(cls, cfg: TrainConfig, *, new: bool) -> WandbLogger | None:
        """The run's logger, or None without logging.wandb. new: a new run folder (else the W&B run
        recorded in it is continued)."""
        section = cfg.logging.wandb
        if section is None:
            return None
        wandb = _import_wandb()
        id_file = cfg.run_dir / ID_FILE
        run_id = id_file.read_text().strip() if not new and id_file.is_file() else None
        if run_id is None:
            run_id = uuid.uuid4().hex[:16]  # W&B run ids: [a-z0-9], unique per project
            write_atomic(id_file, run_id + "\n")
        run = wandb.init(
            project=section.project,
            entity=section.entity,
            mode=section.mode,
            id=run_id,
            name=cfg.run.name,
            resume="allow",
            dir=os.environ.get("WANDB_DIR") or str(cfg.run_dir),
            tags=[cfg.algo, *section.tags],
            config=cfg.model_dump(mode="json"),
            settings=wandb.Settings(init_timeout=INIT_TIMEOUT_S, console="off"),
            reinit="create_new",
        )
        return cls(run, wandb)

    def log_step(self, metrics: dict[str, Any]) -> None:
        self.run.log(flatten(metrics), step=int(metrics["step"]))

    def log_eval(self, result: dict[str, Any]) -> None:
        self.run.log(flatten({k: v for k, v in result.items() if k != "step"}, "eval/"), step=int(result["step"]))

    def log_generations(self, records: list[dict[str, Any]], step: int) -> None:
        """One evaluation's kept generations as the table `eval/generations` at `step` (a row per sample)."""
        columns = list(records[0])  # stare.evaluation.heldout.generation_record's fields, in its order
        table = self._wandb.Table(columns=columns, data=[[r.get(c) for c in columns] for r in records])
        self.run.log({"eval/generations": table}, step=step)

    def log_report(self, report_dir: Path, step: int) -> None:
        """The report's figures (report/<name>) at `step` and summary.md (a run file)."""
        images = {f"report/{png.stem}": self._wandb.Image(str(png)) for png in sorted(Path(report_dir).glob("*.png"))}
        if images:
            self.run.log(images, step=step)
        summary = Path(report_dir) / "summary.md"
        if summary.is_file():
            self.run.save(str(summary), base_path=str(Path(report_dir).parent), policy="now")

    def finish(self) -> None:
        self.run.finish()


def log_report(cfg: TrainConfig, report_dir: Path) -> None:
    """Add the report of a finished run to its W&B run (continued by id); nothing without logging.wandb."""
    logger = WandbLogger.open(cfg, new=False)
    if logger is not None:
        lines = (
            (cfg.run_dir / "metrics.jsonl").read_text().splitlines()
            if (cfg.run_dir / "metrics.jsonl").is_file()
            else []
        )
        step = int(json.loads(lines[-1])["step"]) if lines else 0  # the run's last step (a continued run counts from 0)
        try:
            logger.log_report(report_dir, step)
        finally:
            logger.finish()
