"""`SimWeights`: the weight publisher of `stare sim` and, per rollout lane, its subscriber (`fetch`,
`wait_for`), on the virtual clock."""

from __future__ import annotations

from stare.app.sim.lanes import Lane


class SimWeights:
    """Publisher (learner lane) and subscribers (one view per rollout lane). A version published at
    learner time t is sendable at t; a worker takes it at max(its clock, t) and is busy receiving
    for `recv_s`. `sync` (max_staleness 0, no background publisher): the learner waits out the send."""

    def __init__(self, learner: Lane, send_s: float, recv_s: float, *, sync: bool):
        self.learner, self.send_s, self.recv_s, self.sync = learner, send_s, recv_s, sync
        self.sent: list[tuple[int, float]] = []  # (version, sendable at)

    def publish(self, version: int, state_dict) -> None:
        self.sent.append((version, self.learner.now))
        if self.sync:
            self.learner.busy(self.send_s, "send/receive")

    def serve_joiners(self, version: int, state_fn) -> bool:
        return False

    def close(self) -> None:
        pass

    def view(self, lane: Lane) -> WeightView:
        return WeightView(self, lane)


class WeightView:
    def __init__(self, board: SimWeights, lane: Lane):
        self.board, self.lane = board, lane

    def newest(self, have: int, at: float) -> tuple[int, float] | None:
        ok = [(v, t) for v, t in self.board.sent if v > have and t <= at]
        return max(ok) if ok else None

    def fetch(self, have_version: int):
        got = self.newest(have_version, self.lane.now)
        if got is None:
            return None
        if self.board.sync:  # a synchronous broadcast from t_send: an idle worker took part from its start
            self.lane.busy(max(0.0, got[1] + self.board.recv_s - self.lane.now), "send/receive")
        else:
            self.lane.busy(self.board.recv_s, "send/receive")
        return got[0], {}

    def wait_for(self, min_version: int, timeout_s: float) -> bool:
        times = [t for v, t in self.board.sent if v >= min_version]
        if not times:
            raise RuntimeError(
                f"stare sim: a worker waits for weight version {min_version}, never published "
                "(a scheduling bug in the simulated node)"
            )
        self.lane.wait_until(min(times))
        return True

    def close(self) -> None:
        pass
