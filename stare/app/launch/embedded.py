"""`stare train`: the whole RL loop in one process, the distributed system's roles wired through
their in-memory seams (MemoryTransport streams, MemoryWeightBoard).

    feeder -> prompts -> RolloutWorker -> raw -> RewardWorker -> scored -> GroupCollector
           -> Learner (DeepSpeed, STARE) -> MemoryWeightBoard -> RolloutWorker ...

Outputs under runs/<name>/ (stare.observe.run_outputs): config.yaml, metrics.jsonl, eval.jsonl, trained.jsonl, tb/,
checkpoints/ (model, optimizer, controller, data cursor, RNG states), report/ at the end.
Ctrl-C (or SIGTERM) stops after the current step and leaves a resumable checkpoint; a second
Ctrl-C aborts at once. During start-up (lock, model load, DeepSpeed init, feeder) the first one stops
at once: nothing has trained, nothing is saved. `--resume runs/<name>` continues with the same step numbering, controller
state and data order: each group samples from a seed of (run seed, group id), so a resumed run
reproduces an uninterrupted one. The loop itself is `learner.loop.session.TrainingSession`, the
same one `stare learner` runs; this module only wires its in-memory seams.
"""

from __future__ import annotations

import signal
import sys
import time
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from stare.app.launch.run_folder import run_lock
from stare.config import TrainConfig
from stare.runstate import MemoryRunState, RunSteering
from stare.runtime.liveness import Liveness
from stare.runtime.run_lock import write_failure


class StopDuringStartup(KeyboardInterrupt):
    """SIGINT/SIGTERM while the run starts: the start is abandoned where it is (a KeyboardInterrupt, so that
    no library's `except Exception` swallows it)."""


class StopFlag:
    """Set by SIGINT/SIGTERM: finish the step, checkpoint, exit. A second SIGINT aborts. While `starting`
    (model load, DeepSpeed init), the first signal raises StopDuringStartup at once."""

    def __init__(self) -> None:
        self.requested = False
        self.starting = False

    def __call__(self, signum, frame) -> None:
        if self.starting:
            self.requested, self.starting = True, False
            raise StopDuringStartup(signal.Signals(signum).name)
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


class EmbeddedRun:
    """The in-memory seams and in-process workers of one run, driven by the shared
    `TrainingSession` (learner/loop/session.py): setup once, then `train()`."""

    def __init__(
        self,
        cfg: TrainConfig,
        *,
        resume: bool,
        log: Callable[[str], None] = print,
        steering: RunSteering | None = None,
        warn: Callable[[str], None] | None = None,
    ):
        """`warn`: where a reward failure is logged with its sample (None: the `reward.scorers` logger)."""
        from learner.loop.build import build_session
        from learner.loop.group_collector import MemoryDecisionLog
        from learner.loop.session import MemoryCursor, SessionSeams, seed_everything
        from learner.step.trainer import Learner
        from reward.scorers import build_scorer, scorer_judge
        from reward.worker import RewardWorker
        from rollout.stack import StackEvaluator, build_rollout_stack
        from rollout.worker import RolloutWorker
        from stare.app.colocation.one_gpu import Colocation, colocated, offload_wanted
        from stare.data.feeder import build_feeder
        from stare.transport.in_memory import MemoryTransport
        from stare.weight_sync.in_memory import MemoryWeightBoard

        self.cfg, self.log = cfg, log
        self.run_dir = cfg.run_dir
        self.stop = StopFlag()
        seed_everything(cfg)
        shared = colocated(cfg)  # one GPU: the engine sleeps while the learner steps (stare/app/colocation/one_gpu.py)
        self.stack = build_rollout_stack(cfg, log, sleep_mode=shared)
        if shared:
            self.stack.engine.sleep()  # before the learner takes its memory
        setup = self.stack.setup
        self.tokenizer, self.task = setup.tokenizer, setup.task
        self.learner = Learner(cfg, setup.model_path, pad_id=self.tokenizer.pad_token_id or 0)
        self.transport = MemoryTransport()
        if shared:  # the published weights wait in host memory while the learner steps (fresh copies: not copied again)
            self.learner.publish_from = "host"
        self.board = MemoryWeightBoard(copy=not shared)
        r = cfg.rollout
        feeder = build_feeder(cfg, self.task, self.tokenizer, log)
        self.rollout = RolloutWorker(
            self.stack.engine,
            self.tokenizer,
            self.transport.prompts,
            self.transport.raw,
            self.board,
            name="rollout-0",
            max_new_tokens=r.max_new_tokens,
            temperature=r.temperature,
            top_p=r.top_p,
            stop_token_ids=setup.stop_ids,
            agent=self.stack.agent,
            seed=cfg.run.seed,
            max_prompt_len=cfg.data.max_prompt_len,
            prompt_overflow=cfg.data.prompt_overflow,
            keep_rows=cfg.reward is not None and cfg.reward.needs_rows,
        )
        # a reward with a function of the user's own scores in the scoring processes (time and memory limits)
        self.scorer = build_scorer(cfg, self.task, warn=warn)
        self.reward = RewardWorker(
            self.task, self.transport.raw, self.transport.scored, name="reward-0", scorer=self.scorer
        )
        if steering is None:  # no control plane: the same loop, its requests never come
            steering = RunSteering(MemoryRunState(cfg.run.name), heartbeat_s=cfg.system.heartbeat_s)
        # heartbeats from a thread while `train` runs, healthy while the loop ticks or its busy work uses CPU: a
        # step longer than system.dead_after_s still shows the learner alive (stare/runtime/liveness.py)
        self.liveness = Liveness(steering, heartbeat_s=cfg.system.heartbeat_s, stall_s=cfg.system.stall_s)
        evaluator = StackEvaluator(self.stack, cfg, judge=scorer_judge(self.scorer))  # scored as training is
        self.colocation = None
        if shared:
            import torch

            offload = offload_wanted(cfg, setup.model_path, torch.cuda.is_available(), log)
            self.colocation = Colocation(
                self.stack.engine, self.rollout.sync_weights, learner_engine=self.learner.engine, offload=offload
            )
            evaluator = self.colocation.evaluating(evaluator)
            log(
                f"colocated: the {cfg.rollout.engine.name} engine sleeps while the learner steps"
                + ("; the optimizer state waits in host memory while it samples" if offload else "")
            )
        seams = SessionSeams(
            transport=self.transport,
            publisher=self.board,
            steering=steering,
            cursor=MemoryCursor(),
            evaluator=evaluator,
            should_stop=lambda: self.stop.requested,
            wait=time.sleep,
            tick=self.liveness.tick,
            busy=self.liveness.busy,
            pump=self._pump,
        )
        # the workers run in process between steps, with the newest weights: strictly on-policy
        self.session = build_session(
            cfg,
            self.learner,
            feeder,
            seams,
            decisions=MemoryDecisionLog(),
            rollout_in_process=True,
            resume=resume,
            say=log,
        )
        self.outputs = self.session.outputs
        import json

        from stare.observe.files import write_atomic
        from stare.observe.machine import fingerprint

        # what this run ran on (model hash, torch kernels, packages): docs/results.md says why
        write_atomic(self.run_dir / "machine.json", json.dumps(fingerprint(setup.model_path), indent=2) + "\n")

    def _pump(self, fill_round: int) -> None:
        """One synchronous round of the in-process workers: sample up to prompts_per_step pending prompts
        (colocated: every pending prompt, in batches of prompts_per_step, within one wake: an over-sampled
        round, data.oversample, is more than one batch, and each wake moves the engine's weights and the
        learner's optimizer state), score what was sampled."""
        batch = self.cfg.rollout.prompts_per_step
        with self.liveness.busy("sampling"):
            if self.colocation is None:
                self.rollout.run_once(max_prompts=batch)
            elif self.transport.prompts.backlog():  # wake the engine only when there is something to sample
                with self.colocation.awake():
                    while self.transport.prompts.backlog() and self.rollout.run_once(max_prompts=batch):
                        pass
            self.reward.run_once()

    def sample(self) -> tuple[list, list[str], dict[str, Any]]:
        """The next step's batch, sampled and scored (what `train` would train next)."""
        while (batch := self.session.next_batch()) is None:
            pass
        return batch

    def train(
        self,
        stop: StopFlag | None = None,
        on_step: Callable[[dict[str, Any]], None] | None = None,
        steering: RunSteering | None = None,
    ):
        """Train to run.steps (or until `stop` is requested: then checkpoint and return). `steering`
        replaces the run steering given at construction (tests drive one directly)."""
        if stop is not None:
            self.stop = stop
        if steering is not None:
            self.session.seams.steering = self.liveness.steering = steering
        with self.liveness.running():  # the heartbeat thread, for the run's length
            return self.session.run(on_step)  # a RunOutcome (learner/loop/run_outcome.py)

    def close(self) -> None:
        if self.colocation is not None:
            e = self.colocation.events
            self.log(
                f"colocated: {e['wakes']:.0f} wakes; wake + weights {e['wake_s']:.1f} s, sleep {e['sleep_s']:.1f} s"
                + (
                    f", optimizer offload {e['offload_s']:.1f} s, reload {e['reload_s']:.1f} s"
                    if self.colocation.offload
                    else ""
                )
                + " in all"
            )
        self.session.close()
        self.scorer.close()
        self.stack.close()


@contextmanager
def _control_plane(cfg: TrainConfig, log: Callable[[str], None]):
    """With control_plane.serve_in_train: the API on localhost over an in-memory RunState, yielding the
    loop's RunSteering (None when off or when the services extra is not installed)."""
    if not cfg.control_plane.serve_in_train:
        yield None
        return
    try:
        from services.control.embedded import EmbeddedControlPlane
    except ImportError as err:  # a learner-only install: train without the API
        log(
            f"control plane off ({err}); install stare[services] to serve it, or --set control_plane.serve_in_train=false"
        )
        yield None
        return
    state = MemoryRunState(cfg.run.name, dead_after_s=cfg.system.dead_after_s)
    steering = RunSteering(state, heartbeat_s=cfg.system.heartbeat_s)
    with EmbeddedControlPlane(cfg, state, log), steering.beating():  # alive through long steps (status phase)
        yield steering


def run_training(cfg: TrainConfig, *, resume: bool = False, progress: bool = True) -> Path:
    """Train (or resume) one run; returns the run folder. Writes the report at the end. A run that
    trained nothing, or stopped without a reward signal, raises `NothingTrained` (its report is
    written when it trained a step)."""
    from rich.console import Console

    from reward.verifiers.function import check_functions

    check_functions(cfg.reward)  # a reward function that cannot load: one line before anything is built

    console = Console(stderr=True)
    log = console.log if progress else (lambda *_: None)
    step_lines = None  # without a terminal (or with logging.format json): a line per N steps, no bar
    if progress and (cfg.logging.format == "json" or not console.is_terminal):
        from stare.observe.log_format import StepLines, train_logger

        logger = train_logger(cfg.logging.format, cfg.run.name)
        # the total: the session's steps once it has them (run.steps null: derived from data.epochs at start)
        log, step_lines = logger.info, StepLines(cfg.logging.every_n_steps, cfg.run.steps or 0, logger)
    stop = StopFlag()
    with _signals(stop):  # also over the report and export: a Ctrl-C then lets them finish
        try:
            run, outcome = _train(cfg, resume, log, console, progress, step_lines, stop)
        except StopDuringStartup as sig:
            again = f"resume with: stare train --resume {cfg.run_dir}" if resume else "start it again"
            print(f"stopped by {sig} during start-up: nothing trained; {again}", file=sys.stderr, flush=True)
            return cfg.run_dir
        except OSError as err:  # a full or read-only disk: one line with the last complete checkpoint
            failure = write_failure(err, cfg.run_dir, again=f"resume: stare train --resume {cfg.run_dir}")
            if failure is None:
                raise
            raise failure from err
        finished = outcome.outcome == "finished" and not stop.requested  # a signal during the report does not undo it
        if (finished or outcome.failed) and run.learner.step > 0:
            from stare.app.report import write_report
            from stare.observe.wandb_log import log_report

            report = write_report(run.run_dir)
            log_report(cfg, report)  # to W&B with logging.wandb
            log(f"report: {report / 'summary.md'}")
        if finished:
            from learner.engine.export import export_run

            export_run(run.run_dir, run.stack.setup.model_path, log, cfg.model.dtype)
    if outcome.failed:
        from learner.loop.run_outcome import NothingTrained

        raise NothingTrained(f"{run.run_dir}: {outcome.message}")
    if not finished:  # said even without progress output: the one line a stopped run needs
        from learner.engine.checkpoints import holds_checkpoint

        again = (
            f"resume with: stare train --resume {run.run_dir}"
            if holds_checkpoint(run.run_dir / "checkpoints")
            else "nothing to resume: start it again"
        )
        print(f"stopped after step {run.learner.step}; {again}", file=sys.stderr, flush=True)
    return run.run_dir


def _train(cfg: TrainConfig, resume: bool, log, console, progress: bool, step_lines, stop: StopFlag):
    """The run itself, under its lock and control plane; returns it closed, and its RunOutcome."""
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    stop.starting = True  # a signal from here until the session runs stops the start at once
    with run_lock(cfg.run_dir, resume=resume, say=log), _control_plane(cfg, log) as steering:
        # reward failures are warnings even without progress output (then through logging, to stderr)
        run = EmbeddedRun(cfg, resume=resume, log=log, steering=steering, warn=log if progress else None)
        stop.starting = False  # from here on a signal stops after the current step (with a checkpoint)
        if stop.requested:  # a signal that a library's cleanup swallowed
            run.close()
            raise StopDuringStartup("a signal")
        steps = run.session.steps  # run.steps, or derived from data.epochs
        if step_lines is not None:
            step_lines.total_steps = steps
        columns = [
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[live]}"),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
        ]
        with Progress(
            *columns, console=console, disable=not progress or step_lines is not None, transient=False
        ) as bar:
            task = bar.add_task(f"{cfg.algo} {cfg.run.name}", total=steps, completed=run.learner.step, live="")

            def on_step(m: dict[str, Any]) -> None:
                if step_lines is not None:
                    step_lines(m)
                    return
                live = (
                    f"reward {m['reward_mean']:.2f}  entropy {m['entropy']:.3f} (target {m['target']:.2f})  "
                    f"gate {'on ' if m['gate'] else 'off'}  W {m['w']:.2f} M {m['m']:.2f}"
                )
                bar.update(task, completed=m["step"], live=live)

            try:
                outcome = run.train(stop, on_step)
            finally:
                run.close()
    return run, outcome
