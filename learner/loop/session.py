"""The training session: THE loop of a run, the same for `stare train` (in-memory seams) and
`stare learner` (Redis streams, a weight broadcast, the other roles in other processes).

    start -> [evaluate at step 0, or the resumed step's evaluation a restart lost]
    loop:  steering (pause, checkpoint, entropy changes) -> fill (publish prompts up to the window, pump,
           pull scored groups; while short, the pre-pass of ready groups) -> train -> publish weights
           -> evaluate when due (a remote evaluator after a checkpoint due then) -> metrics, status -> checkpoint
    end:   run.steps trained, or data.epochs' prompts used up (`_data_used_up`), or a stop: checkpoint
           what is unsaved, say finished/stopped

What differs between the modes is only what is passed in (`SessionSeams`; learner/loop/build.py builds
the session for each): streams, weight publisher, decision log, feeder cursor store, evaluator, and
`pump`: in-process workers (or the node-colocated learner's engines) run once per fill round. The window: prompts_per_step x (1 + max_staleness) x data.oversample groups in
flight, each stamped with the weight version at publish time; on-policy sampling goes in rounds
(`_fill_round`) that do not depend on the mode. Checkpoints hold model, optimizer, controller, feeder
cursor, finished groups and RNG states; a step's scored entries are acknowledged once a checkpoint
holds the step.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch

from learner.engine.rng import rng_state, seed_everything, set_rng_state  # noqa: F401  (seed_everything: for the modes)
from learner.loop.early_prepass import EarlyPrepass
from learner.loop.group_collector import round_size
from learner.loop.lost_groups import LostGroups
from learner.loop.run_outcome import EmptySteps, RunOutcome
from learner.loop.session_seams import CursorStore, EvaluationStopped, Evaluator, MemoryCursor, SessionSeams  # noqa: F401  (the modes import them here)
from stare.config import TrainConfig
from stare.data.feeder import run_steps
from stare.observe.files import read_jsonl
from stare.observe.log_format import StepLines
from stare.observe.run_outputs import RunOutputs, batch_metrics, staleness_status, staleness_summary, trained_lags
from stare.observe.watch import RunWatch
from stare.transport.base import dead_letter_counts, queue_depths
from stare.weight_sync.base import publisher_metrics

log = logging.getLogger(__name__)

PAUSE_POLL_S = 0.2  # while paused: how often the steering is asked again
PULL_BLOCK_S = 0.5  # without a pump: how long a fill round waits for scored entries


class TrainingSession:
    def __init__(
        self,
        cfg: TrainConfig,
        learner,
        feeder,
        collector,
        seams: SessionSeams,
        *,
        max_staleness: int,
        resume: bool,
        say: Callable[[str], None] = log.info,
    ):
        self.cfg, self.learner, self.feeder, self.collector, self.seams = cfg, learner, feeder, collector, seams
        self.max_staleness, self.say = max_staleness, say
        resume_step = row = None
        if resume:
            from learner.engine.checkpoints import choose_checkpoint  # verified first; a damaged one falls back, loudly

            ckpt_dir = cfg.run_dir / "checkpoints"
            state = learner.load(ckpt_dir, choose_checkpoint(ckpt_dir, log.warning, cfg.run.checkpoint_verify))
            feeder.load_state_dict(state["data"])
            if "collector" in state:
                collector.load_state_dict(state["collector"])
            else:  # `stare train` before the shared loop: taken between steps, every published group done
                collector.finished.watermark = max(collector.finished.watermark, feeder.cursor)
            if "rng" in state:  # likewise those of `stare learner`
                set_rng_state(state["rng"])
            resume_step, row = learner.step, state.get("row")  # row: a step's metrics not logged before its wait
            say(f"resumed {cfg.run_dir} at step {learner.step}")
        # never publish a group twice: continue after what earlier incarnations published
        feeder.cursor = max(seams.cursor.load(), feeder.cursor)
        self.outputs = RunOutputs(cfg, resume_step=resume_step, row=row)  # damaged log lines: a warning each
        self.steps = run_steps(cfg, feeder, say)  # run.steps, or derived from data.epochs
        self.step_lines = StepLines(cfg.logging.every_n_steps, self.steps, log)  # a log line per N steps
        self.watch = RunWatch.of(cfg.logging, getattr(feeder, "tokenizer", None), say)  # runs that cannot learn
        published = seams.cursor.load_version()
        if published > learner.version:  # a learner killed after its checkpoint published newer weights
            say(
                f"weights up to version {published} were published after the checkpoint (version {learner.version}); "
                f"publishing the checkpoint's weights as version {published + 1}"
            )
            learner.version = published + 1
            getattr(seams.evaluator, "abandon_open", lambda: None)()  # one it left open is never collected now
        self._publish(learner.state_dict_for_rollout())
        self.resumed, self._paused = resume_step is not None, False
        self._last_step_at = time.monotonic()
        self.lost = LostGroups(feeder, collector, seams.transport, say)  # published groups found nowhere
        self._round = 0  # fill rounds since the last step
        self._whole_rounds = max_staleness == 0 and cfg.data.oversample > 1.0  # over-sampled on-policy rounds
        self._filtered0 = collector.stats.filtered_groups
        self._t_wait = time.perf_counter()
        self._early = EarlyPrepass(cfg, learner, collector, lambda what: self.seams.busy(what))  # while waiting

    # ---------------------------------------------------------------- pieces
    def top_up_prompts(self) -> int:
        """Publish prompts until ceil(prompts_per_step x (1 + max_staleness) x oversample) groups are in
        flight; on-policy a round's size (`round_size`: nothing is unresolved, in flight is trainable)."""
        want, over = self.cfg.rollout.prompts_per_step, self.cfg.data.oversample
        in_flight = self.feeder.cursor - len(self.collector.finished)
        filtered = self.collector.stats.filtered_groups - self._filtered0  # this step's
        need = (
            math.ceil(want * (1 + self.max_staleness) * over) - in_flight
            if self.max_staleness > 0
            else round_size(want - in_flight, over, trainable=in_flight, filtered=filtered)
        )
        if need <= 0:
            return 0
        tasks = self.feeder.next_tasks(need)
        for t in tasks:
            t.min_weight_version = self.learner.version
        self.seams.transport.prompts.publish(tasks)
        self.seams.cursor.save(self.feeder.cursor)
        return len(tasks)

    def _publish(self, state: Mapping[str, torch.Tensor]) -> None:
        # recorded first: a successor publishes above any number a learner dying mid-send left with workers
        self.seams.cursor.save_version(self.learner.version)
        self.seams.publisher.publish(self.learner.version, state)

    def evaluate(
        self, weights: Callable[[], Mapping[str, torch.Tensor]] | None = None, final: bool = False
    ) -> dict[str, Any] | None:
        """Held-out results of the current weights (`weights`: the state dict just published, not gathered
        twice); `final`: the run's last evaluation (`task.final_eval_k`); None: a stop ended the wait (not logged)."""
        learner = self.learner
        try:
            with self.seams.busy("evaluating"):
                result = self.seams.evaluator(learner.version, weights or learner.state_dict_for_rollout, final=final)
        except EvaluationStopped as stopped:
            self.say(str(stopped))
            return None
        result.update(step=learner.step, final=final)
        self.outputs.log_eval(result)
        self.say(
            f"held-out at step {learner.step}: greedy {result['greedy_accuracy']:.3f}, "
            f"pass@{result['k']} {result['pass_at_k']:.3f}"
        )
        return result

    def _eval_due(self, step: int) -> bool:
        every, last = self.cfg.task.eval_every, self.steps
        return self.seams.evaluator is not None and (step % every == 0 or step == last)

    def _checkpoint_due(self, step: int) -> bool:
        return step % self.cfg.run.checkpoint_every == 0 or step == self.steps

    def _evaluated(self, step: int) -> bool:
        """eval.jsonl has the evaluation of `step` (a learner killed while it waited for one has not)."""
        return any(r.get("step") == step for r in read_jsonl(self.outputs.dir / "eval.jsonl"))  # damaged lines: skipped

    def checkpoint(self, row: dict[str, Any] | None = None) -> None:
        """`row`: the step's metrics row when it is not logged yet (written on resume if it never was)."""
        ckpt_dir = self.outputs.ckpt_dir
        ckpt_dir.mkdir(parents=True, exist_ok=True)
        data, collector = self.feeder.state_dict(), self.collector.state_dict()
        with self.seams.busy("checkpointing"):
            tag = self.learner.save(ckpt_dir, {"data": data, "collector": collector, "rng": rng_state(), "row": row})
        acked = self.collector.ack_trained()  # only now: the checkpoint holds what they trained
        self.outputs.prune_checkpoints()
        self.say(f"checkpoint {ckpt_dir / tag} (acknowledged {acked} trained trajectories)")

    def _serve_joiners(self) -> None:
        self.seams.publisher.serve_joiners(self.learner.version, self.learner.state_dict_for_rollout)

    def _obey_steering(self) -> bool:
        """Before a fill round: apply entropy changes, save a requested checkpoint; False while the
        run is paused (after waiting a moment, serving weight joiners)."""
        steering = self.seams.steering
        directives = steering.before_step(self.learner.controller)
        if directives.checkpoint:
            self.checkpoint()
        if directives.paused:
            if not self._paused:
                self._paused = True
                steering.set_phase("paused")
                self.say(f"paused before step {self.learner.step + 1} (resume through the control plane)")
            steering.heartbeat()
            self._serve_joiners()
            self.seams.wait(PAUSE_POLL_S)
            return False
        if self._paused:  # resumed: say so now, not only after the next step (which may wait for data)
            self._paused = False
            steering.set_phase("training")
            self.say("resumed")
        return True

    def _unresolved(self) -> int:
        """Published groups not complete yet (being sampled or scored somewhere)."""
        return self.feeder.cursor - len(self.collector.finished) - len(self.collector.closed)

    def _fill_round(self) -> None:
        """Publish prompts, let the workers run, read what they scored.

        On-policy (max_staleness 0) sampling goes in rounds, as in the reference's dynamic sampling:
        a round publishes the groups still missing for the step (x data.oversample, `round_size`: the step
        then waits for the whole round, trains its first prompts_per_step groups in publish order and drops
        the rest, counted, as the reference truncates its generation batch), and the next round starts
        only once every group of the last one is complete (trainable or filtered), at most
        `data.max_sampling_rounds` a step. So the rounds, and what they sample, do not depend on
        whether the workers are in this process or in others. Off-policy the window is kept full."""
        collector, want = self.collector, self.cfg.rollout.prompts_per_step
        if self.max_staleness > 0:
            self._round += int(self.top_up_prompts() > 0)
        elif (
            self._unresolved() == 0 and len(collector.ready) < want and self._round < self.cfg.data.max_sampling_rounds
        ):
            self.top_up_prompts()
            self._round += 1
        if self.seams.pump is not None:
            self.seams.pump(self._round)
            collector.pull(self.learner.version, block_s=PULL_BLOCK_S if self.seams.pump_via_redis else 0.0)
        else:
            self._serve_joiners()
            collector.pull(self.learner.version, block_s=PULL_BLOCK_S)
            if time.monotonic() - self._last_step_at > self.cfg.system.lost_group_check_s:  # once per that long
                self._last_step_at = time.monotonic()
                self.lost.waiting(self.learner.version, want)  # says what it waits for; re-issues lost groups

    def _data_used_up(self) -> bool:
        """data.epochs' prompts all handed out and resolved, and too few groups ready for a whole step."""
        want = self.cfg.rollout.prompts_per_step
        return self.feeder.exhausted and self._unresolved() == 0 and len(self.collector.ready) < want

    def _end_of_data(self) -> None:
        """Say why the run ends before its steps; evaluate the last step if that is not done yet."""
        step, left = self.learner.step, len(self.collector.ready)
        self.say(
            f"data.epochs={self.cfg.data.epochs} used up at step {step} ({self.feeder.cursor:,} prompts handed out; "
            f"{left} trainable group(s) left, fewer than a step's {self.cfg.rollout.prompts_per_step}, not trained)"
        )
        if self.seams.evaluator is not None and not self._evaluated(step):
            self.evaluate(final=True)

    def _batch_ready(self) -> bool:
        """Enough groups (over-sampled on-policy: and the whole round done), or on-policy rounds used up and done."""
        if len(self.collector.ready) >= self.cfg.rollout.prompts_per_step and (
            not self._whole_rounds or self._unresolved() == 0
        ):
            return True
        return self.max_staleness == 0 and self._round >= self.cfg.data.max_sampling_rounds and self._unresolved() == 0

    def next_batch(self) -> tuple[list, list[str], dict[str, Any]] | None:
        """One fill round; then the step's groups (flattened), their stream ids and how they were
        collected, or None while not enough are ready (having prepared the ready ones' pre-pass)."""
        self._fill_round()
        if self._data_used_up():  # the loop ends the run
            return None
        if not self._batch_ready():
            self._early.run(self._whole_rounds)
            return None
        cfg, stats = self.cfg, self.collector.stats
        stale0 = stats.stale_tokens
        trajectories, ids = self.collector.take(
            cfg.rollout.prompts_per_step, in_publish_order=self._whole_rounds, learner_version=self.learner.version
        )
        info: dict[str, Any] = {
            "stale_tokens": stats.stale_tokens - stale0,  # left out of the loss: older than max_staleness
            "sampling_rounds": self._round,
            "surplus_groups": self.collector.drop_ready() if self._whole_rounds else 0,  # the round's trainable rest
            "filtered_groups": stats.filtered_groups - self._filtered0,
            "groups": len(trajectories) // max(cfg.rollout.samples_per_prompt, 1),
            "time_wait_data_s": time.perf_counter() - self._t_wait,  # the pre-pass ahead of the step included
            "prepared_groups": self._early.groups,  # pre-passes run while waiting (some may not be trained now)
            "time_prepare_s": self._early.seconds,
        }
        if cfg.rollout.tool_use.enabled and trajectories:  # of the groups kept for training
            turns = [t.turns for t in trajectories]
            info["tool_call_rate"] = float(np.mean([n > 1 for n in turns]))
            info["turns_mean"] = float(np.mean(turns))
        return trajectories, ids, info

    def _step(self, trajectories: list, ids: list[str], info: dict[str, Any], on_step) -> None:
        cfg, learner, collector = self.cfg, self.learner, self.collector
        stats = collector.stats
        with self.seams.busy("training step"):
            metrics = learner.train_step(trajectories)
        collector.trained(trajectories, ids)
        t_pub = time.perf_counter()
        state = learner.state_dict_for_rollout()
        self._publish(state)
        step_time = time.perf_counter() - self._t_wait
        lags = trained_lags(trajectories, learner.version - 1)
        metrics.update(info)
        metrics.update(batch_metrics(trajectories, step_time))
        metrics.update(self.watch.step(learner.step, trajectories), **getattr(self.feeder, "coverage", {}))
        metrics.update(
            algo=cfg.algo, time_unix=time.time(), time_publish_s=time.perf_counter() - t_pub, **stats.totals()
        )
        metrics.update(**publisher_metrics(self.seams.publisher), **staleness_summary(lags))
        step, saved = learner.step, False
        if self._eval_due(step):
            weights = lambda s=state: s  # noqa: E731  (the evaluator in this process reads the published copy)
            if getattr(self.seams.evaluator, "remote", False):  # a wait on other processes
                weights = state = None  # the workers hold this version: the copy is not kept through the wait
                # a due checkpoint before the wait; none for the evaluation alone (at 7B 107 GB each): a learner killed
                # in the wait loses no data (acks follow checkpoints), it retrains from its last and evaluates again
                if saved := self._checkpoint_due(step):
                    self.outputs.log_trained(step, [t.trajectory_id for t in trajectories])  # lineage before the acks
                    self.checkpoint(row=dict(metrics))  # a learner lost in the wait resumes past the step: its row
            if (result := self.evaluate(weights, final=step == self.steps)) is not None:
                metrics["eval_greedy_accuracy"] = result["greedy_accuracy"]
        del state  # a full copy of the weights (15 GB at 7B): not kept between steps
        status = {
            "weight_version": learner.version,
            "queue_depths": queue_depths(self.seams.transport),
            "dead_letters": dead_letter_counts(self.seams.transport),
            "staleness": staleness_status(lags),
            "tokens_per_s": metrics["tokens_per_s"],
            "step_time_s": step_time,
        }
        self.seams.steering.after_step(learner.controller, metrics, status)
        self.outputs.log_step(metrics)
        if not saved:
            self.outputs.log_trained(step, [t.trajectory_id for t in trajectories])
        self.step_lines(metrics)
        if on_step is not None:
            on_step(metrics)
        if not saved and (self._checkpoint_due(step) or self.seams.should_stop()):
            self.checkpoint()
        self._round, self._filtered0, self._t_wait = 0, stats.filtered_groups, time.perf_counter()
        self._early.new_step()
        self._last_step_at = time.monotonic()

    # ---------------------------------------------------------------- the loop
    def run(self, on_step: Callable[[dict[str, Any]], None] | None = None) -> RunOutcome:
        """Train to run.steps, a stop request, or a run with nothing to train (learner/loop/run_outcome.py)."""
        learner, seams = self.learner, self.seams
        start_step = learner.step
        seams.steering.start(
            learner.controller, learner.step, {"weight_version": learner.version}, resumed=self.resumed
        )
        if self._eval_due(learner.step) and not self._evaluated(learner.step) and not seams.should_stop():
            self.evaluate(final=learner.step == self.steps)  # step 0, or lost with a restart; not when stopping
        empty, gave_up, used_up = EmptySteps(), None, False
        stats = self.collector.stats
        filtered0, dead0 = stats.filtered_groups, stats.dead_lettered_groups
        while learner.step < self.steps:
            # In-process workers hold what a step collected only in memory: stop, checkpoint and
            # pause between steps only. With workers in other processes it is in Redis: any time.
            between_steps = seams.pump is None or seams.pump_via_redis or self._round == 0
            if between_steps and seams.should_stop():
                break
            seams.tick(step=learner.step, weight_version=learner.version)
            if between_steps and not self._obey_steering():
                continue
            if used_up := self._data_used_up():
                self._end_of_data()
                break
            batch = self.next_batch()
            if batch is None:
                continue
            trajectories, ids, info = batch
            if not trajectories:  # on-policy: no group of this step's rounds had a reward signal
                gave_up = empty.add(
                    stats.filtered_groups - filtered0, stats.dead_lettered_groups - dead0, self.collector.dead_reasons
                )
                self.collector.dead_reasons.clear()
                self.say(f"no group with a reward signal after {self._round} rounds; sampling again")
                self._round = 0
                filtered0, dead0 = stats.filtered_groups, stats.dead_lettered_groups
                if gave_up is not None:
                    self.say(f"stopping: {empty.message(gave_up)}")
                    break
                continue
            empty = EmptySteps()
            self.collector.dead_reasons.clear()
            self._step(trajectories, ids, info, on_step)
            filtered0, dead0 = stats.filtered_groups, stats.dead_lettered_groups
        saved = (self.outputs.ckpt_dir / f"step_{learner.step:06d}").exists()
        if self.collector.unacked or ((seams.should_stop() or used_up) and not saved and learner.step > start_step):
            self.checkpoint()  # leave nothing trained unsaved, and a checkpoint to resume from (none: nothing new)
        outcome = gave_up or ("finished" if learner.step >= self.steps or used_up else "stopped")
        message = empty.message(gave_up) if gave_up else None
        seams.steering.set_phase(
            "failed" if gave_up else outcome, step=learner.step, **({"reason": message} if message else {})
        )
        self.outputs.tb.flush()
        return RunOutcome(outcome, learner.step - start_step, message)

    def close(self) -> None:
        self.seams.publisher.close()
        self.outputs.close()
