"""The node-colocated learner in `stare sim`, run through the product's own pieces.

What runs unchanged (as `stare learner` with `system.colocate: on` runs them): `colocated_seams` (the session's
`SamplePump` and `InProcessPublisher`), `DeferredPublish` and `TrainsAsleep` around the learner, and one
`NodeRollout` per rank (stare/app/colocation/node.py: its `check_node_colocation`, its `Colocation` that wakes
the engine, loads the rank's weights and puts it back to sleep, its RolloutWorker and streaming loop that take
the rank's share and then whatever the prompts stream still holds). Stood in: each rank's engine (a `SimEngine`
that sleeps and wakes on its rank's lane), the rank channel (`run_op`: every rank's part of a SAMPLE op, the op
ending at the slowest rank), the ZeRO-3 gather, DeepSpeed's optimizer offload.

Every rank's part of an op runs in its own thread, one at a time: a `Baton` lets the rank whose clock is
earliest act (ties: the lower rank), so the ranks share the prompts stream as concurrent processes would and
the simulation stays deterministic.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from stare.app.sim.lanes import Lane


class Baton:
    """One thread at a time, the one whose lane's clock is earliest. Every rank is registered before any thread
    starts (a thread started first must not run ahead of ranks not yet started)."""

    def __init__(self, lanes: dict[int, Lane]) -> None:
        self.cv = threading.Condition()
        self.active: dict[int, Lane] = dict(lanes)  # rank -> its lane, until its part of the op ends

    def turn(self, rank: int) -> None:
        with self.cv:
            self.cv.notify_all()
            self.cv.wait_for(lambda: rank not in self.active or self._first() == rank)

    def _first(self) -> int:
        return min(self.active, key=lambda r: (self.active[r].now, r))

    @contextmanager
    def running(self, rank: int):
        try:
            self.turn(rank)
            yield
        finally:
            with self.cv:
                self.active.pop(rank, None)
                self.cv.notify_all()


class SimDeepSpeed:
    """The learner engine as `Colocation` sees it for the optimizer offload: its ZeRO stage and the state moved
    over PCIe (`offload_s` each way) on the calling rank's lane."""

    def __init__(self, stage: int, offload_s: float, lane: Callable[[], Lane]):
        self.stage, self.offload_s, self.lane = stage, offload_s, lane

    def zero_optimization_stage(self) -> int:
        return self.stage

    def offload_states(self, *args: Any, **kwargs: Any) -> None:
        self.lane().busy(self.offload_s, "send/receive")

    def reload_states(self, non_blocking: bool = False) -> None:
        self.lane().busy(self.offload_s, "send/receive")


@dataclass
class SimStack:
    """What `build_rollout_stack` gives a NodeRollout: the engine and the setup's tokenizer and stop ids."""

    engine: Any
    setup: Any

    def close(self) -> None:
        pass


class RankLearners:
    """The learner of every rank as the colocated node's pieces call it: rank 0's SimLearner (the session's), and
    the rank channel (`run_op`) and per-rank calls (`weights_for_local_engine`) on the calling rank's lane."""

    def __init__(self, node, learner, *, world: int, collective: bool, gather_s: float, offload_s: float):
        self.node, self._learner, self.world = node, learner, world
        self.collective, self.gather_s = collective, gather_s
        self.rollouts: list[Any] = []  # NodeRollout by rank (attached after construction)
        self.engine = SimDeepSpeed(node.cfg.optim.zero_stage, offload_s, node.current_lane)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._learner, name)

    def weights_are_collective(self) -> bool:
        return self.collective

    def weights_for_local_engine(self, keep: bool = True) -> dict:
        self.node.current_lane().busy(self.gather_s, "send/receive")  # ZeRO-3: every rank takes part
        return {}

    def run_op(self, op: str, args: tuple, local: Callable[[], Any]) -> list:
        """Every rank's part of `op` (rank 0's `local()`, the others' `NodeRollout.sample(*args)`), each on its
        lane in its own thread, one at a time by the baton; their reports by rank once all are back."""
        baton, reports = Baton(dict(enumerate(self.node.rank_lanes))), [None] * self.world
        errors: list[BaseException] = []

        def part(rank: int) -> None:
            lane = self.node.rank_lanes[rank]
            self.node.set_current(lane, rank)
            try:
                with baton.running(rank):
                    reports[rank] = local() if rank == 0 else self.rollouts[rank].sample(*args)
            except BaseException as err:
                errors.append(err)

        threads = [threading.Thread(target=part, args=(r,), name=f"sim-rank-{r}") for r in range(self.world)]
        self.node.baton = baton
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.node.baton = None
        if errors:
            raise errors[0]
        return reports


def colocated_parts(node, learner, costs) -> tuple[Any, dict[str, Any]]:
    """The session's learner and seams of a simulated node-colocated learner: one NodeRollout per rank on its
    SimEngine, the product's seams (`colocated_seams`), and a pump that runs the product's SamplePump on the
    virtual clock. Raises the product's ConfigError for a config the colocated node refuses."""
    from types import SimpleNamespace

    from learner.process.colocation import DeferredPublish, TrainsAsleep
    from learner.process.role import colocated_seams
    from learner.process.sample_progress import LocalBoard
    from stare.app.colocation.node import NodeRollout
    from stare.app.sim.task import SimTokenizer

    cfg, world = node.cfg, len(node.rank_lanes)
    nc = costs.engine
    zero3 = cfg.optim.zero_stage == 3 and world > 1
    ranks = RankLearners(
        node,
        learner,
        world=world,
        collective=zero3,
        gather_s=nc.allgather_s(nc.model.weight_bytes, world) if zero3 else 0.0,
        offload_s=12 * nc.model.shape.params / world / nc.gpu.host_link_bytes_s,
    )
    setup = SimpleNamespace(tokenizer=SimTokenizer(), stop_ids=())
    for rank, engine in enumerate(node.rank_engines):
        rollout = NodeRollout(
            cfg,
            "",
            f"sim-{rank}",
            say=lambda s: None,
            progress=LocalBoard(),  # the ranks are threads on one virtual clock: the op ends at the slowest (run_op)
            build_stack=lambda *a, e=engine, **k: SimStack(e, setup),
            connect=lambda c, url: node.transport,
            cuda=True,  # a simulated GPU: the colocated node checks what a GPU run checks
            evaluates=False,  # the held-out evaluation is modelled apart (stare/app/sim/evaluation.py)
        )
        node.set_current(node.rank_lanes[rank], None)
        rollout.build(node.model_path, rank, world)  # check_node_colocation; the engine put to sleep
        rollout.attach(ranks)
        ranks.rollouts.append(rollout)
    node.set_current(None, None)
    runtime = SimpleNamespace(busy=_not_busy)
    seams = colocated_seams(cfg, runtime, ranks, ranks.rollouts[0], node.transport, world)
    sample_pump = seams.pop("pump")

    def pump(fill_round: int) -> None:
        node.colocated_op(sample_pump, fill_round)

    return DeferredPublish(TrainsAsleep(ranks, ranks.rollouts[0])), {**seams, "pump": pump}


@contextmanager
def _not_busy(what: str):
    yield
