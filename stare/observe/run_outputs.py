"""A run folder's outputs, shared by the embedded and the distributed learner.

    runs/<name>/config.yaml     the config the run was started with
    runs/<name>/metrics.jsonl   one line per optimizer step
    runs/<name>/eval.jsonl      one line per held-out evaluation
    runs/<name>/trained.jsonl   one line per step: the trajectory ids it trained (data lineage)
    runs/<name>/generations.jsonl  per evaluation, logging.eval_generations problems per data source: prompt,
                                reference answer, greedy and one sampled response with their scores (also
                                TensorBoard text eval/generations and the W&B table eval/generations)
    runs/<name>/tb/             TensorBoard events
    runs/<name>/wandb/          Weights & Biases files (with logging.wandb; stare.observe.wandb_log)
    runs/<name>/checkpoints/    the newest `keep` checkpoints and a `latest` pointer

On resume every jsonl file is cut back to the checkpoint's step, so a step that ran after the
checkpoint and is trained again appears once; a damaged line (a crash mid-write, a disk error) is moved
to `<file>.damaged` with a warning naming its line, never taking the lines after it along
(stare.observe.files.cut_jsonl). config.yaml is replaced atomically (write_atomic): a crash or a full
disk leaves the old one whole.
"""

from __future__ import annotations

import json
import logging
import shutil
from collections import Counter
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import yaml

from stare.config import TrainConfig
from stare.observe.files import cut_jsonl, read_jsonl, write_atomic

if TYPE_CHECKING:
    from stare.transport.records import Trajectory

log = logging.getLogger(__name__)

JSONL = ("metrics.jsonl", "eval.jsonl", "trained.jsonl", "generations.jsonl")


def batch_metrics(trajectories: Sequence[Trajectory], elapsed_s: float) -> dict[str, float]:
    """The per-step numbers of the trained batch both learners log (embedded and distributed)."""
    rewards = [_reward(t) for t in trajectories]
    lengths = [len(t.response_token_ids) for t in trajectories]
    return {
        "reward_mean": sum(rewards) / len(rewards),
        # the scorer's verdict (with a composed reward, its math component), else reward >= 1
        "accuracy": sum(bool((t.reward_info or {}).get("correct", r >= 1.0)) for t, r in zip(trajectories, rewards))
        / len(rewards),
        "response_length_mean": sum(lengths) / len(lengths),
        "tokens_per_s": sum(lengths) / max(elapsed_s, 1e-9),
        "time_step_s": elapsed_s,
    }


def _reward(t: Trajectory) -> float:
    if t.reward is None:
        raise ValueError(f"trajectory {t.trajectory_id} reached the learner unscored (reward None)")
    return t.reward


def trained_lags(trajectories: Sequence[Trajectory], trained_at_version: int) -> Counter[int]:
    """Weight-version lag of each trained trajectory: the version it was trained at minus the one
    that sampled its oldest token still in the loss (0 = on-policy; a trajectory sampled across weight
    updates may have older tokens, left out of the loss)."""
    return Counter(trained_at_version - _oldest_trained(t) for t in trajectories)


def _oldest_trained(t: Trajectory) -> int:
    if not t.version_starts:
        return t.weight_version
    versions = t.token_versions()[t.loss_mask > 0]  # [tokens in the loss]
    return int(versions.min()) if versions.size else t.newest_version


def staleness_summary(lags: Counter[int]) -> dict[str, Any]:
    """A step's staleness as metrics (both learners)."""
    n = sum(lags.values())
    if not n:
        return {"staleness_mean": None, "staleness_max": None, "staleness_hist": {}}
    return {
        "staleness_mean": sum(k * v for k, v in lags.items()) / n,
        "staleness_max": max(lags),
        "staleness_hist": {str(k): v for k, v in sorted(lags.items())},
    }


def staleness_status(lags: Counter[int]) -> dict[str, Any]:
    """A step's staleness as the run status shows it (the control plane's /v1/status and Prometheus)."""
    return {"max": max(lags) if lags else None, "counts": {str(k): v for k, v in sorted(lags.items())}}


def generations_markdown(records: list[dict[str, Any]]) -> str:
    """The kept generations as the Markdown TensorBoard's text panel renders: one section per sample."""
    parts = []
    for i, r in enumerate(records, 1):
        parts.append(
            f"### {i}. {r['data_source']} {r['problem_id']}\n\n**Prompt:** {r['prompt']}\n\n"
            f"**Reference:** {r['ground_truth']}\n\n**Greedy (score {r['score']}):** {r['response']}\n\n"
            f"**Sampled (score {r['sampled_score']}):** {r['sampled_response']}\n"
        )
    return "\n---\n\n".join(parts)


class RunOutputs:
    def __init__(
        self,
        cfg: TrainConfig,
        *,
        resume_step: int | None,
        row: dict[str, Any] | None = None,
        warn: Callable[[str], None] = log.warning,
    ) -> None:
        """resume_step: the checkpoint's step when resuming (files are cut back to it), None for a new run.
        `row`: the checkpoint's own metrics row, logged here if metrics.jsonl lacks its step (a learner lost
        between that checkpoint and the row: a remote evaluation's wait). `warn`: where a damaged log line is
        reported."""
        self.cfg = cfg
        self.dir = cfg.run_dir
        self.ckpt_dir = self.dir / "checkpoints"
        self.dir.mkdir(parents=True, exist_ok=True)
        write_atomic(self.dir / "config.yaml", yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False))
        for name in JSONL:
            if resume_step is None:
                (self.dir / name).unlink(missing_ok=True)
            else:
                cut_jsonl(self.dir / name, resume_step, warn)
        from torch.utils.tensorboard import SummaryWriter

        self.tb = SummaryWriter(str(self.dir / "tb"), purge_step=resume_step + 1 if resume_step is not None else None)
        from stare.observe.wandb_log import WandbLogger

        self.wandb = WandbLogger.open(cfg, new=resume_step is None)  # None without logging.wandb
        if row is not None and not any(r.get("step") == row["step"] for r in read_jsonl(self.dir / "metrics.jsonl")):
            warn(
                f"step {row['step']}'s metrics were never logged (the learner was lost after its checkpoint): logged now"
            )
            self.log_step(row)

    def _append(self, name: str, record: dict[str, Any]) -> None:
        with (self.dir / name).open("a") as f:
            f.write(json.dumps(record) + "\n")

    def log_step(self, metrics: dict[str, Any]) -> None:
        self._append("metrics.jsonl", metrics)
        for key, value in metrics.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                self.tb.add_scalar(key, value, metrics["step"])
        if self.wandb is not None:
            self.wandb.log_step(metrics)

    def log_eval(self, result: dict[str, Any]) -> None:
        """The evaluation's numbers (eval.jsonl, TensorBoard, W&B); its kept generations, when it has them,
        go to `log_generations` (taken out of `result`: eval.jsonl keeps the numbers only)."""
        generations = result.pop("generations", None)
        self._append("eval.jsonl", result)
        for key in ("greedy_accuracy", "pass_at_k", "avg_at_k"):
            self.tb.add_scalar(f"eval/{key}", result[key], result["step"])
        if self.wandb is not None:
            self.wandb.log_eval(result)
        if generations:
            self.log_generations(result["step"], generations)

    def log_generations(self, step: int, records: list[dict[str, Any]]) -> None:
        """Sample generations of one evaluation: generations.jsonl (a line each, with the step), TensorBoard
        text and a W&B table, as verl's trainer.log_val_generations logs them (verl/utils/tracking.py)."""
        for record in records:
            self._append("generations.jsonl", {"step": step, **record})
        self.tb.add_text("eval/generations", generations_markdown(records), step)
        if self.wandb is not None:
            self.wandb.log_generations(records, step)

    def log_trained(self, step: int, trajectory_ids: list[str]) -> None:
        self._append("trained.jsonl", {"step": step, "ids": trajectory_ids})

    def prune_checkpoints(self) -> None:
        tags = sorted(p.name for p in self.ckpt_dir.glob("step_*"))
        for old in tags[: -self.cfg.run.keep_checkpoints]:
            shutil.rmtree(self.ckpt_dir / old, ignore_errors=True)

    def close(self) -> None:
        self.tb.flush()
        self.tb.close()
        if self.wandb is not None:
            self.wandb.finish()
            self.wandb = None
