"""The node-colocated learner's held-out evaluation, spread over every rank's engine (the EVALUATE op,
learner/process/colocation.py), instead of rank 0's engine alone while the others sleep.

    rank 0 (the session's evaluator):  EVALUATE op (version, final) to every rank
    every rank:  [ZeRO-3: the gather, every rank] -> wake, this rank's learner's weights in place -> sample the
                 held-out problems i with i % world == rank (greedy + the setting's n, each problem from its own
                 seed: rollout/evaluation.py `sample_problems`) -> sleep -> beat on the board while it runs ->
                 wait for every rank -> its responses to rank 0 (the op's gather)
    rank 0:      every problem's responses, scored in one call of the run's scorer, summarized
                 (`score_samples`): the result one engine evaluating every problem gives

A problem's samples come from its own seed whichever rank samples it, so the result does not depend on the
number of ranks (tests/app/test_node_evaluation.py splits the problems over engines; tests/system/
test_modes_agree.py compares 2 colocated ranks with `stare train`). The op is bounded: a rank whose
part runs past `task.eval_timeout_s`, or whose beats stop for the stall limit, fails it on every rank (the
learner restarts as a whole from its last checkpoint, as for a SAMPLE op). Every rank builds its problems when its rollout side is
attached, and checks them against rank 0's (a digest with the op) before it samples.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from rollout.evaluation import ProblemSamples, sample_problems, score_samples
from stare.data.tasks.base import Problem
from stare.evaluation.heldout import eval_settings


def problems_digest(problems: Sequence[Problem]) -> str:
    """What the ranks compare before an EVALUATE op: the held-out problems' prompts and answers, in order."""
    h = hashlib.sha256()
    for p in problems:
        h.update(f"{p.prompt}\x1f{p.answer}\x1e".encode())
    return h.hexdigest()[:12]


class RankEvaluation:
    """One rank's part of an EVALUATE op on its NodeRollout (engine, `Colocation`, learner, board)."""

    def __init__(self, rollout, world: int):
        from rollout.stack import StackEvaluator

        self.rollout, self.world = rollout, world
        # the held-out problems as the in-process evaluator builds them (the prompt policy, the engine's room)
        self.problems = StackEvaluator(rollout.stack, rollout.cfg).problems
        self.ops = self.sampled = 0  # EVALUATE ops run, held-out problems this rank sampled in them
        self.digest = problems_digest(self.problems)

    def indices(self, rank: int) -> range:
        return range(rank, len(self.problems), self.world)

    def __call__(self, version: int, final: bool, digest: str) -> list[ProblemSamples]:
        from learner.process.sample_progress import beating

        r = self.rollout
        if digest != self.digest:
            raise RuntimeError(
                f"learner rank {r.rank}: its held-out problems ({len(self.problems)}, digest {self.digest}) are not "
                f"rank 0's (digest {digest}): every rank must read the same task.eval_problems from the same data"
            )
        engine, setup, indices = r.engine, r.stack.setup, self.indices(r.rank)
        need = bool(indices) and engine.weight_version < version  # a rank without a share loads nothing
        # ZeRO-3: every rank takes part in the gather; the gathered copy is dropped once loaded (not held on
        # the GPU beside the awake engine while it samples)
        box = [r.learner.weights_for_local_engine(keep=need)] if (r.collective or need) else []

        def load() -> None:
            state = box.pop() if box else None
            if need:
                engine.update_weights(state, version)

        settings = eval_settings(r.cfg, final=final)
        r.board.begin("EVALUATE")
        with beating(r.board, limit_s=r.cfg.task.eval_timeout_s, what="sampling its held-out share"):
            if indices:
                with r.colocation.awake(sync=load):
                    samples = sample_problems(
                        r.stack.sampler,
                        setup.tokenizer,
                        self.problems,
                        indices,
                        stop_token_ids=setup.stop_ids,
                        **settings,
                    )
            else:
                samples = []
        box.clear()
        r.board.wait_all()
        self.ops, self.sampled = self.ops + 1, self.sampled + len(samples)
        return samples


class NodeEvaluator:
    """Rank 0's held-out evaluator of a node-colocated learner of several ranks: the EVALUATE op, then every
    problem's responses scored by the run's scorer (`judge`) as one engine's would be."""

    # not `remote`: a checkpoint due at the step follows the op (as for an in-process evaluator), and a failed op
    # retrains from the last checkpoint
    remote = False

    def __init__(self, learner, rollout, part: RankEvaluation, judge: Callable, generations: int):
        self.learner, self.rollout, self.part, self.judge, self.generations = learner, rollout, part, judge, generations

    def __call__(
        self, version: int, weights: Callable[[], Mapping[str, Any]] | None = None, final: bool = False
    ) -> dict[str, Any]:
        """`weights` is not read: each rank's engine takes its own learner's (the session's `DeferredPublish`
        gathers nothing then)."""
        from learner.process.colocation import EVALUATE

        args = (version, final, self.part.digest)
        parts = self.learner.run_op(EVALUATE, args, lambda: self.rollout.evaluate_part(*args))
        samples = [s for part in parts for s in part]
        s = eval_settings(self.rollout.cfg, final=final)
        return score_samples(
            self.rollout.stack.setup.task,
            self.part.problems,
            samples,
            k=s["k"],
            temperature=s["temperature"],
            top_p=s["top_p"],
            per_source=s["per_source"],
            judge=self.judge,
            version=version,
            generations=self.generations,
        )
