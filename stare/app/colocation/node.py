"""The node-colocated learner's rollout side (`system.colocate: on` in `stare up` / `stare learner`): the
engine, rollout worker and `Colocation` of one learner rank, behind learner/process/colocation.py's `RankRollout`
(the learner role drives it; this module wires the rollout role's pieces into it, so neither role imports
the other).

    build:   the engine (vLLM: sleep mode; several ranks: joining the learner's torch.distributed world)
             -> asleep before the rank's Learner takes the GPU
    SAMPLE:  take prompts (reclaimed ones first) -> [ZeRO-3: the gather rank 0 asked for, every rank]
             -> none taken: stay asleep; else wake -> this rank's learner's weights in place (no host round
             trip unless system.weight_sync_publish_from is host) -> sample the prompts stream until it is
             empty and the engine idle (the streaming loop for vLLM, batches of `share` for hf), publishing
             each group to raw with the ack of its prompt, its progress on the board -> sleep -> wait on the
             board for every rank (learner/process/sample_progress.py) -> the op's gather
    EVALUATE (several ranks): every rank samples its share of the held-out problems on its own engine with its
             learner's weights, rank 0 scores them all (stare/app/colocation/node_evaluation.py)
    one rank: held-out evaluation on its own engine, woken for it (`AwakeEvaluator`)

Which rank samples which prompt depends on who asks first; the samples do not: each group samples from
the seed of (run seed, group id), whoever takes it (tests/system/test_modes_agree.py compares the run with
`stare train`). Rewards come from the reward worker processes (`stare up` starts them).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from stare.config import TrainConfig

if TYPE_CHECKING:
    from learner.process.sample_progress import DecodeMeter, SampleBoard

log = logging.getLogger(__name__)


class RankWeights:
    """The rollout worker's weight subscriber in a learner rank: never a source. The engine takes its rank's
    learner's weights at each wake (`NodeRollout.sample`), so a prompt never waits for a newer version."""

    def __init__(self, engine):
        self.engine = engine

    def fetch(self, have_version: int):
        return None

    def wait_for(self, min_version: int, timeout_s: float) -> bool:
        raise RuntimeError(
            f"a prompt asks for weights of version {min_version}, but this learner rank's engine took "
            f"version {self.engine.weight_version} at its wake, its learner's newest"
        )

    def close(self) -> None:
        pass


class NodeRollout:
    """One learner rank's rollout (learner/process/colocation.py `RankRollout`); see the module docstring."""

    def __init__(
        self,
        cfg: TrainConfig,
        redis_url: str,
        name: str,
        say: Callable[[str], None] = log.info,
        progress: SampleBoard | None = None,
        clock: Callable[[], float] = time.monotonic,
        *,
        build_stack: Callable[..., Any] | None = None,
        connect: Callable[[TrainConfig, str], Any] | None = None,
        cuda: bool | None = None,
        evaluates: bool = True,
    ):
        """`progress`: where the ranks show their progress in a SAMPLE op (default: the learner's store with
        several ranks, nowhere with one; a simulation passes its own); `clock`: what the op's limit is measured
        with (learner/process/sample_progress.py). `build_stack` / `connect`: the rollout stack and the run's
        streams (default: rollout.stack's build_rollout_stack, stare.runtime.process.connect_transport); `cuda`:
        whether this rank has CUDA (None: ask torch); `evaluates`: whether this rank takes part in held-out
        evaluations (the EVALUATE op). `stare sim` passes its stand-ins, states a GPU and models the evaluation
        apart (stare/app/sim/evaluation.py)."""
        self.cfg, self.redis_url, self.name, self.say = cfg, redis_url, name, say
        self.build_stack, self.connect, self.cuda, self.evaluates = build_stack, connect, cuda, evaluates
        self.stack = self.worker = self.stream = self.colocation = self.learner = self.transport = None
        self.scorer = None  # rank 0's evaluation scorer (`evaluator`)
        self.rank, self.world, self.collective = 0, 1, False
        self._evaluation = None  # this rank's part of the EVALUATE op (built at the first one)
        self.board, self.clock = progress, clock

    def build(self, model_path: Path, rank: int, world: int) -> None:
        import torch

        from rollout.stack import build_rollout_stack
        from stare.config.colocation import check_node_colocation

        cuda = torch.cuda.is_available() if self.cuda is None else self.cuda
        check_node_colocation(self.cfg, cuda=cuda)
        vllm = self.cfg.rollout.engine.name == "vllm"
        self.rank, self.world = rank, world
        if self.board is None:
            from learner.process.rank_launch import rank_timeout_s
            from learner.process.sample_progress import LocalBoard, StoreBoard

            self.board = (
                StoreBoard.on_default_group(rank, world, stall_s=rank_timeout_s(self.cfg), say=self.say)
                if world > 1
                else LocalBoard()
            )
        self.stack = (self.build_stack or build_rollout_stack)(
            self.cfg, self.say, model_path=model_path, sleep_mode=vllm, external_launcher=vllm and world > 1
        )
        self.stack.engine.sleep()  # before the learner takes its memory

    def attach(self, learner) -> None:
        from rollout.streaming import StreamingLoop, streaming_enabled
        from rollout.worker import RolloutWorker
        from stare.app.colocation.one_gpu import Colocation
        from stare.runtime.process import connect_transport

        cfg, engine, setup = self.cfg, self.stack.engine, self.stack.setup
        self.learner, self.collective = learner, learner.weights_are_collective()
        self.transport = (self.connect or connect_transport)(cfg, self.redis_url)
        r = cfg.rollout
        self.worker = RolloutWorker(
            engine,
            setup.tokenizer,
            self.transport.prompts,
            self.transport.raw,
            RankWeights(engine),
            name=f"{self.name}-rollout-{self.rank}",
            max_new_tokens=r.max_new_tokens,
            temperature=r.temperature,
            top_p=r.top_p,
            stop_token_ids=setup.stop_ids,
            agent=None,
            seed=cfg.run.seed,
            max_prompt_len=cfg.data.max_prompt_len,
            prompt_overflow=cfg.data.prompt_overflow,
            keep_rows=cfg.reward is not None and cfg.reward.needs_rows,
        )
        self.stream = StreamingLoop(self.worker, engine) if streaming_enabled(cfg, engine) else None
        # the weights come per wake (sample's sync); an evaluation's wake takes what the session hands it
        self.colocation = Colocation(
            engine, lambda: None, learner_engine=learner.engine, offload=cfg.system.colocate_offload == "optimizer"
        )
        if (
            self.world > 1 and self.evaluates
        ):  # the held-out problems, built before any op (rank 0 checks each op against them)
            from stare.app.colocation.node_evaluation import RankEvaluation

            self._evaluation = RankEvaluation(self, self.world)

    @property
    def engine(self):
        return self.stack.engine

    def asleep(self) -> bool:
        return bool(self.engine.asleep)

    # ------------------------------------------------------------------ the SAMPLE op
    def sample(self, version: int, share: int, gather: bool) -> dict[str, Any]:
        """This rank's part of a SAMPLE op (learner/process/colocation.py): the engine asleep again at the end,
        then every rank's progress waited for on the board (heartbeats; a limit from the decode rate)."""
        from learner.process.rank_launch import rank_timeout_s
        from learner.process.sample_progress import DecodeMeter

        t0 = time.perf_counter()
        self.board.begin()
        meter = DecodeMeter(self.cfg.rollout.max_new_tokens, floor_s=rank_timeout_s(self.cfg), clock=self.clock)
        self.board.beat(meter.report(), force=True)
        taken = self._take(share)
        need = bool(taken) and self.engine.weight_version < version
        if self.collective and need and not gather:
            raise RuntimeError(
                f"learner rank {self.rank}: its engine has version {self.engine.weight_version}, the op "
                f"samples version {version}, and rank 0 asked for no gather (under ZeRO-3 a rank cannot "
                "gather alone)"
            )
        box: list = []
        if gather or (need and not self.collective):  # ZeRO-3: every rank takes part, keeping it only if it needs it
            box.append(self.learner.weights_for_local_engine(keep=need))
        sampled = 0
        if taken:

            def load() -> None:
                state = box.pop() if box else None
                if need:
                    self.engine.update_weights(state, version)

            with self.colocation.awake(sync=load):
                sampled = self._sample(taken, share, meter)
        box.clear()
        self.board.beat(meter.report(done=True))
        self.board.wait_all()
        return {
            "rank": self.rank,
            "prompts": len(taken),
            "groups": sampled,
            "engine_version": self.engine.weight_version,
            "asleep": self.asleep(),
            "seconds": time.perf_counter() - t0,
        }

    def _take(self, share: int) -> list:
        """Up to `share` prompts for this rank: entries a consumer that is gone left pending (idle longer than
        system.claim_idle_s), this consumer's own pending ones (after a restart), then new ones."""
        prompts, me = self.worker.prompts, self.worker.name
        taken = list(prompts.reclaim(me, max_count=share))
        if len(taken) < share:
            taken += prompts.consume(me, share - len(taken), 0.0)
        return taken

    def _sample(self, taken: list, share: int, meter: DecodeMeter) -> int:
        """`taken` and every prompt the stream still has, until it has none and the engine is idle; the
        groups published. Progress goes to the board after each engine step (each batch with hf)."""
        meter.restart()
        if self.stream is not None:
            before = self.stream.published
            self.stream.offer("train", taken)
            while True:
                self._progress(meter, self.stream.run_once(0.0), steps=1)
                if not self.stream.in_flight():
                    return self.stream.published - before
        done = self.worker.handle(taken)
        self._progress(meter, done, steps=0)
        while deliveries := self.worker.prompts.consume(self.worker.name, share, 0.0):
            groups = self.worker.handle(deliveries)
            self._progress(meter, groups, steps=0)
            done += groups
        return done

    def _progress(self, meter: DecodeMeter, groups: int, steps: int) -> None:
        """Count an engine step (or a batch), beat, and fail the op when no group finished within the limit."""
        meter.step(groups, steps=steps)
        why = meter.overdue()
        if why is not None:
            self.board.beat(meter.report(failed=why))
            raise RuntimeError(f"learner rank {self.rank}: {why}")
        self.board.beat(meter.report())

    # ------------------------------------------------------------------ the held-out evaluation, the end
    def evaluate_part(self, version: int, final: bool, digest: str) -> list:
        """This rank's part of an EVALUATE op (stare/app/colocation/node_evaluation.py)."""
        if self._evaluation is None:
            raise RuntimeError(f"learner rank {self.rank}: an EVALUATE op before its rollout side was attached")
        return self._evaluation(version, final, digest)

    def evaluator(self, learner, world: int):
        """Rank 0's held-out evaluation, scored by the run's scorer (as `stare train` scores its own: a reward
        function of the user's own in the scoring processes): on its own engine with one rank; spread over
        every rank's engine with several (the EVALUATE op that `learner`, rank 0's LeaderLearner, runs)."""
        from reward.scorers import build_scorer, scorer_judge
        from rollout.stack import StackEvaluator
        from stare.app.colocation.node_evaluation import NodeEvaluator

        self.scorer = build_scorer(self.cfg, self.stack.setup.task)
        judge = scorer_judge(self.scorer)
        if world == 1 or self._evaluation is None:
            return self.colocation.evaluating(StackEvaluator(self.stack, self.cfg, judge=judge))
        return NodeEvaluator(learner, self, self._evaluation, judge, self.cfg.logging.eval_generations)

    def summary(self) -> str:
        e = self.colocation.events if self.colocation is not None else {}
        ev = self._evaluation
        held_out = f"; {ev.sampled} held-out problems sampled in {ev.ops} evaluations" if ev is not None else ""
        return (
            f"colocated engine: {e.get('wakes', 0):.0f} wakes, {e.get('sleeps', 0):.0f} sleeps; wake + weights "
            f"{e.get('wake_s', 0.0):.1f} s, sleep {e.get('sleep_s', 0.0):.1f} s in all{held_out}"
        )

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()
        if self.scorer is not None:
            self.scorer.close()
        if self.stack is not None:
            self.stack.close()


def rank_rollout(cfg: TrainConfig, redis_url: str, name: str) -> Callable[[], NodeRollout]:
    """The factory `learner.process.role.run` takes (`rank_rollout`): one per learner rank process."""
    return lambda: NodeRollout(cfg, redis_url, name)
