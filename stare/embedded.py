"""`stare train`: the whole RL loop in one process, the distributed system's roles wired through
their in-memory seams (MemoryTransport streams, MemoryWeightBoard).

    feeder -> prompts -> RolloutWorker -> raw -> RewardWorker -> scored -> GroupCollector
           -> Learner (DeepSpeed, STARE) -> MemoryWeightBoard -> RolloutWorker ...

Outputs under runs/<name>/ (stare.run_outputs): config.yaml, metrics.jsonl, eval.jsonl, trained.jsonl, tb/,
checkpoints/ (model, optimizer, controller, data cursor, RNG states), report/ at the end.
Ctrl-C (or SIGTERM) stops after the current step and leaves a resumable checkpoint; a second
Ctrl-C aborts at once. `--resume runs/<name>` continues with the same step numbering, controller
state and data order: sampling is seeded by (seed, step, round), so a resumed run reproduces an
uninterrupted one.
"""

from __future__ import annotations

import random
import signal
import time
from collections import Counter
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
import yaml

from stare.config import ConfigError, TrainConfig, build_config
from stare.run_outputs import RunOutputs, batch_metrics, staleness_status, staleness_summary, trained_lags
from stare.runstate import MemoryRunState, RunControl

MAX_EMPTY_STEPS = 20
PAUSE_POLL_S = 0.2


class StopFlag:
    """Set by SIGINT/SIGTERM: finish the step, checkpoint, exit. A second SIGINT aborts."""

    def __init__(self) -> None:
        self.requested = False

    def __call__(self, signum, frame) -> None:
        if self.requested and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.requested = True


@contextmanager
def _signals(flag: StopFlag):
    old = {s: signal.signal(s, flag) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)


def _rng_state() -> dict[str, Any]:
    return {
        "python": random.getstate(),
        "numpy": np.random.get_state()[1].tolist(),
        "torch": torch.get_rng_state().tolist(),
    }


def _set_rng_state(state: dict[str, Any]) -> None:
    py = state["python"]
    random.setstate((py[0], tuple(py[1]), py[2]))
    np_state = np.random.get_state()
    np.random.set_state((np_state[0], np.asarray(state["numpy"], dtype=np_state[1].dtype), *np_state[2:]))
    torch.set_rng_state(torch.tensor(state["torch"], dtype=torch.uint8))


def prepare_run(cfg: TrainConfig | None, resume: Path | None, overrides: list[str] = ()) -> TrainConfig:
    """The config of a new run (refusing to overwrite one) or of the run to resume."""
    if resume is not None:
        saved = Path(resume) / "config.yaml"
        if not saved.is_file():
            raise ConfigError(f"--resume {resume}: no config.yaml there; pass a run folder written by `stare train`")
        raw = yaml.safe_load(saved.read_text())
        return build_config(raw, overrides=overrides)
    assert cfg is not None
    if (cfg.run_dir / "checkpoints" / "latest").exists():
        raise ConfigError(
            f"run.name: {cfg.run_dir} already holds a run; resume it with `stare train --resume {cfg.run_dir}` "
            f"or choose another name with --set run.name=NEW"
        )
    return cfg


def resolve_model(cfg: TrainConfig, log: Callable[[str], None]) -> Path:
    if cfg.model.path is not None:
        if not (Path(cfg.model.path) / "config.json").is_file():
            raise ConfigError(f"model.path: {cfg.model.path} is not a Hugging Face model directory (no config.json)")
        return Path(cfg.model.path)
    if cfg.model.source == "smollm2":
        from stare.smollm2 import prepare_smollm2

        return prepare_smollm2(log=log)
    from stare.tiny_model import build_tiny_model

    t0 = time.perf_counter()
    try:
        path = build_tiny_model(task_name=cfg.task.name, seed=cfg.model.tiny_seed, **cfg.model.tiny)
    except TypeError as err:
        raise ConfigError(f"model.tiny: {err}; valid keys are the fields of stare.tiny_model.TinyModelSpec") from None
    log(f"tiny model ready at {path} ({time.perf_counter() - t0:.1f}s)")
    return path


@contextmanager
def run_lock(run_dir: Path):
    """One process per run folder: a second `stare train` on the same run fails at once."""
    import fcntl

    run_dir.mkdir(parents=True, exist_ok=True)
    with open(run_dir / ".lock", "w") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ConfigError(f"run.name: {run_dir} is in use by another stare process; choose another run.name") from None
        handle.write(str(__import__("os").getpid()))
        handle.flush()
        yield


class EmbeddedRun:
    """Setup once, then `train()`; each piece is the one the distributed roles use."""

    def __init__(self, cfg: TrainConfig, *, resume: bool, log: Callable[[str], None] = print):
        from transformers import AutoTokenizer

        from stare.data import build_feeder, eval_problems
        from stare.learner.groups import GroupCollector
        from stare.learner.trainer import Learner
        from stare.reward.trajectory_worker import RewardWorker
        from stare.rollout.engine import build_engine
        from stare.rollout.worker import RolloutWorker
        from stare.tasks.base import build_task
        from stare.transport.memory import MemoryTransport
        from stare.weight_sync.memory import MemoryWeightBoard

        self.cfg, self.log = cfg, log
        self.run_dir = cfg.run_dir
        self.ckpt_dir = self.run_dir / "checkpoints"
        if cfg.run.threads is not None:
            torch.set_num_threads(cfg.run.threads)
        random.seed(cfg.run.seed)
        np.random.seed(cfg.run.seed)
        torch.manual_seed(cfg.run.seed)

        model_path = resolve_model(cfg, log)
        self.tokenizer = AutoTokenizer.from_pretrained(model_path)
        self.task = build_task(cfg.task.name, **cfg.task.build_kwargs(self.tokenizer))
        self.stop_ids = tuple(i for i in (self.tokenizer.eos_token_id,) if i is not None)
        self.engine = build_engine({"name": cfg.rollout.engine, "model_path": str(model_path), "dtype": cfg.model.dtype})
        self.agent = None  # multi-turn tool use: a ToolAgent over the engine and a ProcessSandbox
        if cfg.rollout.tool_use.enabled:
            from stare.rollout.agent_loop import build_tool_agent

            self.agent = build_tool_agent(cfg.rollout.tool_use, self.engine, self.tokenizer)
        self.learner = Learner(cfg, model_path, pad_id=self.tokenizer.pad_token_id or 0)
        self.transport = MemoryTransport()
        self.board = MemoryWeightBoard()
        r = cfg.rollout
        self.feeder = build_feeder(cfg, self.task, self.tokenizer, log)
        self.rollout = RolloutWorker(
            self.engine, self.tokenizer, self.transport.prompts, self.transport.raw, self.board, name="rollout-0",
            max_new_tokens=r.max_new_tokens, temperature=r.temperature, top_p=r.top_p, stop_token_ids=self.stop_ids,
            agent=self.agent,
        )
        self.reward = RewardWorker(self.task, self.transport.raw, self.transport.scored, name="reward-0")
        self.collector = GroupCollector(self.transport.scored, name="learner", dynamic_sampling=cfg.data.dynamic_sampling,
                                        max_staleness=0)
        self.eval_problems = eval_problems(cfg, self.task, self.tokenizer, log)
        if resume:
            state = self.learner.load(self.ckpt_dir)
            self.feeder.load_state_dict(state["data"])
            _set_rng_state(state["rng"])
            self.board.publish(self.learner.version, self.learner.state_dict_for_rollout())
            log(f"resumed {self.run_dir} at step {self.learner.step}")
        self.outputs = RunOutputs(cfg, resume_step=self.learner.step if resume else None)

    # -- pieces of a step -----------------------------------------------------------------------

    def _sample(self) -> tuple[list, list[str], dict[str, Any]]:
        """Sample until prompts_per_step groups are ready (dynamic sampling may need rounds)."""
        cfg, step = self.cfg, self.learner.step
        want = cfg.rollout.prompts_per_step
        rounds, t0 = 0, time.perf_counter()
        filtered0 = self.collector.stats.filtered_groups
        while len(self.collector.ready) < want and rounds < cfg.data.max_sampling_rounds:
            need = want - len(self.collector.ready)
            self.transport.prompts.publish(self.feeder.next_tasks(need))
            self.rollout.run_once(max_prompts=need, seed=cfg.run.seed * 1_000_003 + step * 101 + rounds)
            self.reward.run_once()
            self.collector.pull(self.learner.version)
            rounds += 1
        trajectories, ids = self.collector.take(want)
        elapsed = time.perf_counter() - t0
        tokens = sum(len(t.response_token_ids) for t in trajectories)
        info = {
            "sampling_rounds": rounds,
            "filtered_groups": self.collector.stats.filtered_groups - filtered0,
            "groups": len(trajectories) // max(cfg.rollout.samples_per_prompt, 1),
            "time_rollout_s": elapsed,
            "rollout_tokens_per_s": tokens / max(elapsed, 1e-9),
        }
        if self.agent is not None and trajectories:  # of the groups kept for training
            info["tool_call_rate"] = float(np.mean([t.turns > 1 for t in trajectories]))
            info["turns_mean"] = float(np.mean([t.turns for t in trajectories]))
        return trajectories, ids, info

    def _evaluate(self) -> dict[str, Any]:
        from stare.evaluation import eval_settings, evaluate

        result = evaluate(self.agent or self.engine, self.tokenizer, self.task, self.eval_problems,
                          stop_token_ids=self.stop_ids, **eval_settings(self.cfg))
        result["step"] = self.learner.step
        self.outputs.log_eval(result)
        return result

    def _checkpoint(self) -> None:
        self.ckpt_dir.mkdir(parents=True, exist_ok=True)
        tag = self.learner.save(self.ckpt_dir, {"data": self.feeder.state_dict(), "rng": _rng_state()})
        self.outputs.prune_checkpoints()
        self.log(f"checkpoint {self.ckpt_dir / tag}")


    # -- the loop -----------------------------------------------------------------------------

    def _obey(self, control: RunControl, stop: StopFlag) -> None:
        """Before a step: apply pending entropy changes, save a requested checkpoint, and while the
        run is paused wait here (heartbeating; Ctrl-C still stops)."""
        paused = False
        while True:
            directives = control.before_step(self.learner.controller)
            if directives.checkpoint:
                self._checkpoint()
            if not directives.paused or stop.requested:
                break
            if not paused:
                paused = True
                control.set_phase("paused")
                self.log(f"paused before step {self.learner.step + 1} (resume through the control plane)")
            control.heartbeat()
            time.sleep(PAUSE_POLL_S)
        if paused:
            control.set_phase("training")
            self.log("resumed")

    def _status(self, lags: Counter, metrics: dict[str, Any]) -> dict[str, Any]:
        """The run status the control plane shows (queue depths, staleness distribution, throughput)."""
        return {
            "tokens_per_s": metrics["tokens_per_s"], "step_time_s": metrics["time_step_s"],
            "queue_depths": {name: getattr(self.transport, name).backlog() for name in ("prompts", "raw", "scored")},
            "staleness": staleness_status(lags),
        }

    def train(self, stop: StopFlag, on_step: Callable[[dict[str, Any]], None] | None = None,
              control: RunControl | None = None) -> None:
        """Train to run.steps. `control` (optional): the control plane's adapter; entropy changes
        apply before each step, pause/checkpoint requests are honoured between steps, and each
        step's metrics and the run status are published after it."""
        cfg = self.cfg
        if self.learner.step == 0 and not (self.run_dir / "eval.jsonl").exists():
            self._evaluate()
        if control is not None:
            control.start(self.learner.controller, self.learner.step)
        empty = 0
        while self.learner.step < cfg.run.steps and not stop.requested:
            if control is not None:
                self._obey(control, stop)
                if stop.requested:
                    break
            t0 = time.perf_counter()
            trajectories, ids, info = self._sample()
            if not trajectories:
                empty += 1
                self.log(f"no group with a reward signal after {info['sampling_rounds']} rounds; sampling again")
                if empty >= MAX_EMPTY_STEPS:
                    self.log("every group had equal rewards for too long; stopping (the task is solved or unsolvable)")
                    break
                continue
            empty = 0
            metrics = self.learner.train_step(trajectories)
            self.collector.trained(trajectories, ids)
            self.collector.ack_trained()  # in-memory streams die with the process: nothing to hold
            self.board.publish(self.learner.version, self.learner.state_dict_for_rollout())
            metrics.update(info)
            metrics.update(batch_metrics(trajectories, time.perf_counter() - t0))
            lags = trained_lags(trajectories, self.learner.version - 1)
            metrics.update(algo=cfg.algo, **staleness_summary(lags))
            step = self.learner.step
            if step % cfg.task.eval_every == 0 or step == cfg.run.steps:
                metrics["eval_greedy_accuracy"] = self._evaluate()["greedy_accuracy"]
            if control is not None:
                control.after_step(self.learner.controller, metrics, self._status(lags, metrics))
            self.outputs.log_step(metrics)
            self.outputs.log_trained(step, [t.trajectory_id for t in trajectories])
            if on_step is not None:
                on_step(metrics)
            if step % cfg.run.checkpoint_every == 0 or step == cfg.run.steps or stop.requested:
                self._checkpoint()
        if stop.requested and not (self.ckpt_dir / f"step_{self.learner.step:06d}").exists():
            self._checkpoint()
        self.outputs.tb.flush()

    def close(self) -> None:
        self.outputs.close()
        self.engine.close()


@contextmanager
def _control_plane(cfg: TrainConfig, log: Callable[[str], None]):
    """With control.serve_in_train: the API on localhost over an in-memory RunState, yielding the
    loop's RunControl (None when off or when the services extra is not installed)."""
    if not cfg.control.serve_in_train:
        yield None
        return
    try:
        from stare.services.control.embedded import EmbeddedControlPlane
    except ImportError as err:  # a learner-only install: train without the API
        log(f"control plane off ({err}); install stare[services] to serve it, or --set control.serve_in_train=false")
        yield None
        return
    state = MemoryRunState(cfg.run.name, dead_after_s=cfg.system.dead_after_s)
    with EmbeddedControlPlane(cfg, state, log):
        yield RunControl(state, heartbeat_s=cfg.system.heartbeat_s)


def run_training(cfg: TrainConfig, *, resume: bool = False, progress: bool = True) -> Path:
    """Train (or resume) one run; returns the run folder. Writes the report at the end."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    console = Console(stderr=True)
    log = console.log if progress else (lambda *_: None)
    stop = StopFlag()
    with run_lock(cfg.run_dir), _signals(stop):
        run = EmbeddedRun(cfg, resume=resume, log=log)
        columns = [
            TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[live]}"),
            TimeElapsedColumn(), TimeRemainingColumn(),
        ]
        with Progress(*columns, console=console, disable=not progress, transient=False) as bar:
            task = bar.add_task(f"{cfg.algo} {cfg.run.name}", total=cfg.run.steps, completed=run.learner.step, live="")

            def on_step(m: dict[str, Any]) -> None:
                live = (f"reward {m['reward_mean']:.2f}  entropy {m['entropy']:.3f} (target {m['target']:.2f})  "
                        f"gate {'on ' if m['gate'] else 'off'}  W {m['w']:.2f} M {m['m']:.2f}")
                bar.update(task, completed=m["step"], live=live)

            try:
                with _control_plane(cfg, log) as control:
                    run.train(stop, on_step, control)
                    if control is not None:
                        control.set_phase("stopped" if stop.requested else "finished", step=run.learner.step)
            finally:
                run.close()
    if stop.requested:
        log(f"stopped after step {run.learner.step}; resume with: stare train --resume {run.run_dir}")
    else:
        from stare.learner.export import export_run
        from stare.report import write_report

        report = write_report(run.run_dir)
        log(f"report: {report / 'summary.md'}")
        export_run(run.run_dir, resolve_model(cfg, log), log, cfg.model.dtype)
    return run.run_dir
