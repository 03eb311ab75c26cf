"""The simulated GPU node: the real scheduling of `stare up` on a virtual clock.

Real (the code `stare up` runs, unchanged): `TrainingSession` (learner/loop/session.py: the window, the
on-policy sampling rounds and their over-sampling, `data.oversample`; top-ups, publish, checkpoint cadence), `PromptFeeder`, `GroupCollector`
(complete groups, staleness per token, dynamic sampling), `RolloutWorker` (blocking mode: `run_once` with
`system.rollout_batch_prompts`, its weight wait and records) and its `StreamingLoop` (streaming mode:
the engine's batch kept full, each group published when it ends, weights taken once the engine drains
or, `system.inflight_weight_updates`, between any two steps), `RewardWorker`, `RunSteering`,
`RunOutputs` (metrics.jsonl under the sim's run folder). The in-memory streams (`MemoryStream`) replace
Redis, each wrapped so that an entry becomes visible at the virtual time its producer published it.

Stood in (stare/app/sim/engine.py, learner.py, weights.py, task.py): the rollout engine, the learner's train step / weight gather /
checkpoint write, the weight transport, the task's prompts and its verifier.

The driver is a discrete-event loop run from the session's `pump` seam: each call lets every
rollout and reward actor act up to the learner's clock (earliest clock first), releases what the
learner can see by then, and when nothing new is visible moves the learner's clock to the next event
(the learner waits for data). The held-out evaluation (task.eval_every) is simulated on the stand-in engines
(stare/app/sim/evaluation.py) and its time added to the steps that run it.
"""

from __future__ import annotations

import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path

from stare.app.sim.engine import SimEngine
from stare.app.sim.lanes import Lane
from stare.app.sim.learner import SimLearner
from stare.app.sim.parts import Design, SimTransport, StepCosts
from stare.app.sim.streams import TimedStream
from stare.app.sim.task import SimTask, SimTokenizer, solve_rate_scorer
from stare.app.sim.weights import SimWeights
from stare.runtime.process import stream_backlog


class _Worker:
    """One rollout worker: its lane, stand-in engine, the real RolloutWorker around it and, when the product's
    rule says the worker streams (`rollout.streaming.streaming_loop`), its real StreamingLoop: the engine's
    steps stop at the driver's horizon, so the loop runs one virtual-time slice per act. A publish refused for
    backpressure waits as rollout/role.py does (1 s, then again); a blocking batch's prompts are delivered
    again after system.claim_idle_s (the stream's reclaim)."""

    def __init__(self, node: SimNode, index: int, lane: Lane, engine: SimEngine):
        from rollout.streaming import streaming_loop
        from rollout.worker import RolloutWorker

        cfg, r = node.cfg, node.cfg.rollout
        self.node, self.lane, self.engine, self.name = node, lane, engine, f"rollout-{index}"
        self.weights = node.board.view(lane)
        self.worker = RolloutWorker(
            engine,
            SimTokenizer(),
            node.transport.prompts,
            node.transport.raw,
            self.weights,
            name=self.name,
            max_new_tokens=r.max_new_tokens,
            temperature=r.temperature,
            top_p=r.top_p,
            stop_token_ids=(),
            seed=cfg.run.seed,
            max_prompt_len=cfg.data.max_prompt_len,
            prompt_overflow=cfg.data.prompt_overflow,
        )
        self.batch = cfg.system.rollout_batch_prompts
        self.claim_idle_s = cfg.system.claim_idle_s
        self.loop = streaming_loop(cfg, self.worker, engine)

    def next_time(self) -> float | None:
        """When this worker acts next on what is already published (None: nothing to do)."""
        if self.loop is not None and self.loop.in_flight():
            return self.lane.now
        p = self.node.transport.prompts
        if p.visible():
            return self.lane.now
        t = p.next_time()
        return None if t is None else max(t, self.lane.now)

    def act(self, until: float) -> bool:
        """Act once at this worker's clock (<= until); False when it has nothing to do before `until`."""
        from stare.transport.redis_streams import BackpressureError

        prompts = self.node.transport.prompts
        prompts.release(self.lane.now)
        busy = prompts.visible() or (self.loop is not None and self.loop.in_flight())
        if not busy:
            t = prompts.next_time()
            self.lane.wait_until(until if t is None else min(t, until))
            return t is not None and t <= until
        try:
            if self.loop is not None:
                self.engine.horizon = until
                self.loop.run_once()
            else:
                self.worker.run_once(self.batch)
        except BackpressureError:  # the reward side is behind
            if self.loop is not None:
                self.lane.wait_until(self.lane.now + 1.0)
            else:
                self.lane.wait_until(self.lane.now + self.claim_idle_s)
                prompts.inner.requeue_pending()
        return True


@dataclass
class SimRun:
    """What one simulation produced: the lanes (timelines) and the learner's step ends."""

    design: Design
    lanes: list[Lane]
    learner: Lane
    step_ends: list[tuple[float, int]]
    metrics: list[dict] = field(default_factory=list)
    checkpoint_s: float = 0.0  # one checkpoint write (the learner waits)
    checkpoint_every: int = 0
    eval_s: float = 0.0  # one held-out evaluation (the learner waits, the engines sample it)
    eval_every: int = 0
    colocation_events: list[dict[str, float]] = field(default_factory=list)  # each rank's Colocation.events


class SimNode:
    """Builds the real session over the stand-ins and runs it for `steps` steps."""

    def __init__(
        self,
        cfg,
        design: Design,
        costs: StepCosts,
        lengths,
        *,
        prompt_len: int,
        solve_beta: tuple[float, float] = (1.0, 1.0),
    ):
        self.cfg, self.design, self.costs, self.lengths = cfg, design, costs, lengths
        self.prompt_len, self.solve_beta = prompt_len, solve_beta
        d = design
        self.learner_lane = Lane("learner", list(range(d.learner_gpus)))
        self.current = self.learner_lane  # the actor whose clock stamps what is published (the driver's thread)
        self._local = threading.local()  # a colocated rank's thread: its lane and rank (stare/app/sim/colocated.py)
        self.baton = None  # the colocated SAMPLE op's turn-taking, while one runs
        clock = lambda: self.current_lane().now  # noqa: E731
        self.transport = SimTransport(
            *(TimedStream(name, clock, stream_backlog(cfg)) for name in ("prompts", "raw", "scored"))
        )
        self.board = SimWeights(self.learner_lane, costs.send_s, costs.recv_s, sync=d.max_staleness == 0)
        self.reward_lane = Lane("reward", [])
        self.workers: list[_Worker] = []
        self.rank_lanes: list[Lane] = []
        self.rank_engines: list[SimEngine] = []
        self.model_path = Path("sim")
        if d.colocated and d.product_colocation:
            self._rank_engines(cfg, costs, lengths)
            return
        first = 0 if d.colocated else d.learner_gpus
        engines = (d.gpus if d.colocated else d.gpus - d.learner_gpus) // d.rollout_tp
        if engines < 1:
            raise ValueError(
                f"--gpus {d.gpus} with {d.learner_gpus} learner GPUs leaves no rollout engine of "
                f"{d.rollout_tp} GPU(s); give rollout GPUs or colocate"
            )
        for i in range(engines):
            lane = Lane(f"rollout-{i}", list(range(first + i * d.rollout_tp, first + (i + 1) * d.rollout_tp)))
            engine = SimEngine(
                lane,
                costs.engine,
                lengths,
                capacity=costs.capacity,
                running=costs.running or None,
                kv=costs.kv,
                seed=cfg.run.seed * 1009 + i,
            )
            if costs.static_batch:
                engine.static_batch = True
            self.workers.append(_Worker(self, i, lane, engine))

    def _rank_engines(self, cfg, costs: StepCosts, lengths) -> None:
        """The colocated node: one engine per learner rank on its GPU, asleep while the learner steps."""
        nc = costs.engine
        for i in range(self.design.gpus):
            lane = Lane(f"rank-{i}", [i])
            engine = SimEngine(
                lane,
                nc,
                lengths,
                capacity=costs.capacity,
                kv=costs.kv,
                seed=cfg.run.seed * 1009 + i,
                sleep_s=costs.swap_s / 2,
                wake_s=costs.swap_s / 2,
            )
            engine.refit_s, engine.before_step = costs.send_s, self.yield_turn
            self.rank_lanes.append(lane)
            self.rank_engines.append(engine)
        self.transport.prompts.before_consume = self.yield_turn

    # ------------------------------------------------------------------ threads of the colocated node
    def current_lane(self) -> Lane:
        return getattr(self._local, "lane", None) or self.current

    def set_current(self, lane: Lane | None, rank: int | None = None) -> None:
        self._local.lane, self._local.rank = lane, rank

    def yield_turn(self) -> None:
        """A colocated rank's thread waits here for its turn (its lane's clock the earliest)."""
        rank = getattr(self._local, "rank", None)
        if self.baton is not None and rank is not None:
            self.baton.turn(rank)

    def colocated_op(self, sample_pump, fill_round: int) -> None:
        """The product's SamplePump on the virtual clock: every rank starts when the learner stops, the op ends
        at the slowest rank (the learner waits for it), then the reward workers score what was published."""
        learner, scored = self.learner_lane, self.transport.scored
        self.transport.prompts.release(learner.now)
        for lane in self.rank_lanes:
            lane.wait_until(learner.now)
        self.set_current(self.rank_lanes[0], None)  # one rank: its part runs in this thread
        try:
            sample_pump(fill_round)
        finally:
            self.set_current(None, None)
        learner.wait_until(max(lane.now for lane in self.rank_lanes))
        self._score()
        if not scored.release(learner.now) and not scored.visible() and (t := scored.next_time()) is not None:
            learner.wait_until(t)  # the learner waits for the reward workers
            scored.release(t)

    # ------------------------------------------------------------------ the driver
    def _advance(self, until: float) -> None:
        while True:
            ready = [
                w
                for w in self.workers
                if w.lane.now <= until + 1e-12 and w.next_time() is not None and w.next_time() <= until + 1e-12
            ]
            if not ready:
                break
            w = min(ready, key=lambda w: w.lane.now)
            self.current = w.lane
            try:
                w.act(until)
            finally:
                self.current = self.learner_lane
        self._score()

    def _score(self) -> None:
        raw, lane = self.transport.raw, self.reward_lane
        while (t := raw.next_time()) is not None:
            lane.wait_until(t)
            n = raw.release(t)
            self.current = lane
            try:
                lane.busy(n * self.costs.reward_s_per_traj, "train")
                self.reward.run_once(max_count=n)
            finally:
                self.current = self.learner_lane

    def _pump(self, fill_round: int) -> None:
        learner = self.learner_lane
        while True:
            if self.design.colocated:  # the engines sleep while the learner works on their GPUs
                for w in self.workers:
                    w.lane.wait_until(learner.now)
            self._advance(learner.now)
            scored = self.transport.scored
            # return while scored entries are visible: the collector pulls at most its limit per call
            # (GroupCollector.pull's max_count), so a release larger than that leaves some for the next call
            if scored.release(learner.now) or scored.visible() or self.session._batch_ready():
                return
            times = [
                t for t in [self.transport.scored.next_time(), *(w.next_time() for w in self.workers)] if t is not None
            ]
            if not times:
                raise RuntimeError("stare sim: nothing can happen next (no prompt, sequence or result in flight)")
            learner.wait_until(max(min(times), learner.now + 1e-9))

    def run(self, steps: int, out_dir: Path | None = None) -> SimRun:
        from learner.loop.build import build_session
        from learner.loop.group_collector import MemoryDecisionLog
        from learner.loop.session import MemoryCursor, SessionSeams
        from reward.worker import RewardWorker
        from stare.data.feeder import PromptFeeder
        from stare.runstate import MemoryRunState, RunSteering

        with tempfile.TemporaryDirectory(prefix="stare-sim-") as tmp:
            cfg = self.cfg.model_copy(deep=True)
            cfg.run.output_dir = Path(out_dir or tmp)
            cfg.run.steps = steps
            cfg.run.name = "sim"
            d, t = self.design, self.transport
            task = SimTask(self.prompt_len, self.solve_beta, cfg.run.seed)
            feeder = PromptFeeder(
                task,
                SimTokenizer(),
                run_id=cfg.run.name,
                group_size=cfg.rollout.samples_per_prompt,
                seed=cfg.run.seed,
                pool_size=task.pool,
                max_prompt_len=cfg.data.max_prompt_len,
                prompt_overflow=cfg.data.prompt_overflow,
                log=lambda s: None,
            )
            self.reward = RewardWorker(task, t.raw, t.scored, name="reward-0", scorer=solve_rate_scorer(cfg.run.seed))
            cfg.system.max_staleness = d.max_staleness  # the design's (its config copy)
            product = d.colocated and d.product_colocation
            wait = (lambda: max(w.lane.now for w in self.workers)) if d.colocated and not product else None
            learner = SimLearner(
                cfg,
                self.learner_lane,
                self._step_s,
                self.costs.gather_s,
                self.costs.checkpoint_s,
                wait_engines=wait,
                prepass_s=self.costs.prepass_s,
            )
            session_learner, extra = learner, {"publisher": self.board, "pump": self._pump}
            if product:  # the product's colocated node (stare/app/sim/colocated.py)
                from stare.app.sim.colocated import colocated_parts

                session_learner, extra = colocated_parts(self, learner, self.costs)
                self.rank_rollouts = session_learner.rollouts
            seams = SessionSeams(
                transport=t,
                steering=RunSteering(MemoryRunState(cfg.run.name), heartbeat_s=cfg.system.heartbeat_s),
                cursor=MemoryCursor(),
                evaluator=None,
                should_stop=lambda: False,
                wait=lambda s: None,
                **extra,
            )
            self.session = build_session(
                cfg, session_learner, feeder, seams, decisions=MemoryDecisionLog(), resume=False, say=lambda s: None
            )
            metrics: list[dict] = []
            try:
                self.session.run(on_step=metrics.append)
            finally:
                self.session.close()
        lanes = [self.learner_lane] + [w.lane for w in self.workers] + self.rank_lanes
        return SimRun(
            d,
            lanes,
            self.learner_lane,
            learner.trained_tokens,
            metrics,
            self.costs.checkpoint_s,
            self.cfg.run.checkpoint_every,
            self.costs.eval_s,
            self.cfg.task.eval_every,
            [dict(r.colocation.events) for r in getattr(self, "rank_rollouts", [])],
        )

    def _step_s(self, trajectories: list) -> float:
        if self.design.colocated and not self.design.product_colocation and self.costs.swap_s:
            self.learner_lane.busy(self.costs.swap_s, "send/receive")
        return self.costs.train_s(trajectories)
