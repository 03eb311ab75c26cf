"""Held-out evaluation through the streams (`stare learner`): the rollout workers sample it, the
reward workers score it, the learner only publishes the tasks and adds up the scores.

    StreamEvaluator(version): eval tasks -> eval_prompts ... rollout ... eval_raw ... reward ...
                              eval_scored -> scores per sample -> stare.evaluation.heldout.summarize

The tasks, seeds and the summary are stare.evaluation.heldout's, the same as the in-process evaluator's
(rollout/evaluation.py), so for the same weights both give the same numbers. A sample counts as
correct when its reward worker says so (`reward_info["correct"]`: `reward.scorers.score_input`, the scoring
function of training).

* Workers sample each task with weights of at least `version` (the learner publishes them before
  it evaluates and trains no further until the evaluation is in).
* Exactly once: samples are keyed by trajectory id; a duplicate, or a sample of another evaluation
  (one abandoned before a restart), is acknowledged and ignored. What an evaluation collected is
  acknowledged once its result is computed.
* A restart: the `EvalIndex` says the evaluation was published; a restarted learner collects it
  (its pending entries are re-read) instead of publishing it again; one already closed (its
  samples acknowledged, the result lost with the process) is published again and recomputed; one
  left open under another version (the restart republished the weights as a newer version) is
  closed as superseded, so workers skip its tasks.
* A stop request (SIGTERM, `stare up`'s Ctrl-C) ends the wait at once: `EvaluationStopped`, the
  evaluation left open and what arrived unacknowledged, so the session saves its step and exits within
  its grace period, and the restarted learner (the same version: nothing newer was published) collects it.
* Nothing waits for ever: a sample dead-lettered anywhere on the way (an unsampleable prompt, a
  record that failed scoring) counts as incorrect and is reported with its reason; after
  `task.eval_timeout_s` the result covers what arrived (`complete: false`, the missing samples
  counting as incorrect) and the log says what was missing. While it waits the learner ticks
  (its /healthz stays 200).
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any

from learner.loop.session_seams import EvaluationStopped
from stare.data.feeder import eval_problems
from stare.data.prompt_policy import prompt_ids
from stare.evaluation.heldout import (
    Outcome,
    eval_settings,
    eval_tasks,
    generation_picks,
    generation_record,
    summarize,
)
from stare.evaluation.streams import EvalIndex, EvalStreams
from stare.transport.dead_letters import Feeds, dead_letter_feed
from stare.transport.records import EvalTask, Trajectory

log = logging.getLogger(__name__)

PROGRESS_LOG_S = 60.0  # how often a long wait says what it still misses
POLL_S = 0.5  # one wait for scored samples


class StreamEvaluator:
    remote = True  # a wait on other processes: a checkpoint due at the step is written first (learner/loop/session.py)

    def __init__(
        self,
        cfg,
        task,
        tokenizer,
        streams: EvalStreams,
        index: EvalIndex,
        *,
        tick: Callable[..., None] = lambda **info: None,
        consumer: str = "learner",
        timeout_s: float | None = None,
        say: Callable[[str], None] = log.info,
        stop: Callable[[], bool] = lambda: False,
    ):
        self.cfg, self.streams, self.index, self.tick, self.consumer, self.say = (
            cfg,
            streams,
            index,
            tick,
            consumer,
            say,
        )
        self.problems = eval_problems(cfg, task, tokenizer, say)
        self.picks = generation_picks(self.problems, cfg.logging.eval_generations)  # kept responses' problems
        self.prompts = [prompt_ids(p, tokenizer) for p in self.problems]
        self.settings = eval_settings(cfg)  # the final evaluation's: eval_settings(cfg, final=True)
        self.timeout_s = cfg.task.eval_timeout_s if timeout_s is None else timeout_s
        self.poll_s = min(POLL_S, cfg.system.stall_s / 4)  # ticks well within the liveness limit
        self.dead = Feeds([dead_letter_feed(s) for s in (streams.tasks, streams.raw, streams.scored)])
        self.stop = stop  # a stop request: end a wait at once (EvaluationStopped)

    def abandon_open(self, keep: str | None = None) -> None:
        """Close every open evaluation but `keep` as superseded: a restarted learner whose weights got a newer
        version than any published collects none of them, so the workers skip their tasks now rather than
        sample them for nobody until the next evaluation is published."""
        for stale in set(self.index.open_ids()) - {keep}:
            self.index.close(stale, "superseded")
            self.say(f"evaluation {stale}: left open by an earlier learner; closed (workers skip its tasks)")

    def tasks(self, version: int, settings: dict[str, Any] | None = None) -> list[EvalTask]:
        return eval_tasks(
            self.problems,
            self.prompts,
            run_id=self.cfg.run.name,
            eval_id=f"v{version}",
            version=version,
            **(settings or self.settings),
        )

    def __call__(
        self, version: int, weights: Callable[[], Mapping[str, Any]] | None = None, final: bool = False
    ) -> dict[str, Any]:
        """The result of the evaluation of weight version `version` (`weights` is not used: the
        workers take that version from the weight publisher); `final`: the run's last evaluation
        (`task.final_eval_k` samples when set)."""
        settings = eval_settings(self.cfg, final=final)
        tasks = self.tasks(version, settings)
        eval_id = tasks[0].eval_id
        expected = {f"{t.task_id}:{j}": t for t in tasks for j in range(t.n)}
        seen = self.index.published(eval_id)
        if seen is not None and seen.get("state") == "open":
            self.say(f"evaluation {eval_id}: published before a restart; collecting it")
        else:
            self.abandon_open(keep=eval_id)  # one a killed learner left: nobody waits for it
            self.streams.tasks.publish(tasks)
            self.index.publish(eval_id, {"tasks": len(tasks), "samples": len(expected)})
        scores, dead = self._collect(eval_id, tasks, expected)
        result = self._result(tasks, expected, scores, dead, settings)
        self.index.close(eval_id, "done" if result["missing_samples"] == 0 else "timed out")
        return result

    def _collect(self, eval_id: str, tasks: list[EvalTask], expected: dict[str, EvalTask]):
        """Wait for every expected sample (scored or dead-lettered) or the timeout."""
        by_task = {t.task_id: t for t in tasks}
        scores: dict[str, Trajectory] = {}
        dead: dict[str, str] = {}
        held: list[str] = []
        start = last_log = time.monotonic()
        while len(scores) + len(dead) < len(expected):
            if self.stop():  # nothing acknowledged, the index still open: the next learner collects it
                raise EvaluationStopped(
                    f"evaluation {eval_id}: a stop was requested while waiting ({len(scores)} of {len(expected)} "
                    "samples in); left open for the restarted learner"
                )
            self.tick(evaluating=eval_id, samples=len(scores), of=len(expected))
            deliveries = self.streams.scored.consume(self.consumer, 4096, block_s=self.poll_s)
            other: list[str] = []
            for d in deliveries:
                tid = d.record.trajectory_id
                if tid in expected and tid not in scores and tid not in dead:
                    scores[tid] = d.record
                    held.append(d.id)
                else:  # a duplicate, or a sample of another evaluation
                    other.append(d.id)
            self.streams.scored.ack(other)
            for rec in self.dead.new():
                lost = (
                    [rec.trajectory_id]
                    if rec.trajectory_id in expected
                    else [f"{rec.group_id}:{j}" for j in range(by_task[rec.group_id].n)]
                    if rec.group_id in by_task
                    else []
                )
                for tid in lost:
                    if tid not in scores and tid not in dead:
                        dead[tid] = f"{rec.stream}: {rec.reason}"
            if not deliveries and not hasattr(self.streams.scored, "client"):
                time.sleep(0.01)  # in-memory streams do not block
            now = time.monotonic()
            if now - start > self.timeout_s:
                self.say(
                    f"evaluation {eval_id}: timed out after {self.timeout_s:.0f}s (task.eval_timeout_s); "
                    + self._missing(expected, scores, dead)
                )
                break
            if now - last_log > PROGRESS_LOG_S:
                last_log = now
                self.say(f"evaluation {eval_id}: waiting {now - start:.0f}s; " + self._missing(expected, scores, dead))
        self.streams.scored.ack(held)
        return scores, dead

    def _missing(self, expected: dict[str, EvalTask], scores: dict, dead: dict) -> str:
        missing = [tid for tid in expected if tid not in scores and tid not in dead]
        per_source = Counter(expected[tid].data_source for tid in missing)
        s = self.streams
        return (
            f"{len(missing)} of {len(expected)} samples missing (per source {dict(per_source)}; first "
            f"{missing[:3]}), {len(dead)} dead-lettered; eval queues: tasks {s.tasks.backlog()} not sampled, "
            f"raw {s.raw.backlog()} not scored, scored {s.scored.backlog()} not read"
        )

    def _generation(self, i: int, tasks: list[EvalTask], scores: dict[str, Trajectory]) -> dict[str, Any]:
        """Problem i's kept generation: its greedy sample and its first sampled one (as their reward workers
        scored them; one that did not arrive: no text, score 0, as it counts)."""

        def text_and_score(tid: str) -> tuple[str | None, float]:
            t = scores.get(tid)
            return (None, 0.0) if t is None else (t.response_text, _correct(t))

        greedy, score = text_and_score(f"{tasks[2 * i].task_id}:0")
        sampled, sampled_score = text_and_score(f"{tasks[2 * i + 1].task_id}:0")
        return generation_record(self.problems[i], greedy or "", score, sampled, sampled_score)

    def _result(
        self,
        tasks: list[EvalTask],
        expected: dict[str, EvalTask],
        scores: dict[str, Trajectory],
        dead: dict[str, str],
        settings: dict[str, Any],
    ) -> dict[str, Any]:
        def correct(tid: str) -> float:  # missing or dead-lettered: incorrect
            t = scores.get(tid)
            return 0.0 if t is None else _correct(t)

        outcomes = []
        for greedy, sampled in zip(tasks[0::2], tasks[1::2]):
            ids = [f"{sampled.task_id}:{j}" for j in range(sampled.n)]
            turns = [scores[tid].turns for tid in ids if tid in scores]
            failed = sum(
                "error" in (scores[tid].reward_info or {}) for tid in (f"{greedy.task_id}:0", *ids) if tid in scores
            )
            outcomes.append(
                Outcome(
                    greedy=correct(f"{greedy.task_id}:0"),
                    scores=[correct(tid) for tid in ids],
                    turns=turns if self.cfg.rollout.tool_use.enabled else None,
                    errors=failed,
                )
            )
        s = settings
        result = summarize(
            self.problems,
            outcomes,
            k=s["k"],
            temperature=s["temperature"],
            top_p=s["top_p"],
            per_source=s["per_source"],
        )
        missing = len(expected) - len(scores) - len(dead)
        result.update(
            eval_id=tasks[0].eval_id,
            complete=missing == 0 and not dead,
            missing_samples=missing,
            dead_lettered_samples=len(dead),
            weight_versions=sorted({t.weight_version for t in scores.values()}),
        )
        if self.picks:  # logging.eval_generations: these problems' responses, as the in-process evaluation keeps
            result["generations"] = [self._generation(i, tasks, scores) for i in self.picks]
        if dead:
            result["dead_letter_reasons"] = sorted(set(dead.values()))[:5]
            self.say(
                f"evaluation {tasks[0].eval_id}: {len(dead)} samples dead-lettered (counted incorrect): "
                f"{result['dead_letter_reasons']}"
            )
        return result


def _correct(t: Trajectory) -> float:
    """1.0 when the sample's reward worker counted it correct (`reward_info["correct"]`, else reward >= 1)."""
    return float(bool((t.reward_info or {}).get("correct", (t.reward or 0.0) >= 1.0)))
