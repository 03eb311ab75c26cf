"""The node-colocated SAMPLE op's progress: a limit on each rank's sampling from max_new_tokens and the rank's
measured engine step rate, and heartbeats through the learner's store instead of one gather that times out
after a fixed minute (learner/colocation.py). Real TCPStore, ranks as threads."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest
import torch.distributed as dist

from learner.process.sample_progress import DecodeMeter, StoreBoard, beating, progress_of


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_the_limit_between_two_finished_groups_comes_from_max_new_tokens_and_the_measured_step_rate():
    clock = Clock()
    meter = DecodeMeter(max_new_tokens=15360, floor_s=60.0, clock=clock)
    assert meter.limit_s == 60.0  # no rate yet: the floor alone
    for _ in range(40):  # 20 engine steps a second
        clock.t += 0.05
        meter.step()
    # a whole 15,360-token response takes 15,360 / 20 = 768 s at that rate: the limit is 2 x 768 + 60
    assert meter.steps_per_s == pytest.approx(20.0) and meter.limit_s == pytest.approx(1596.0)
    while clock.t < 1590.0:  # long chain-of-thought: stepping without a finished group for 1,590 s is fine ...
        clock.t += 0.05
        meter.step()
    assert meter.overdue() is None
    meter.step(groups=1)  # a group finished: the wait starts again
    while clock.t < 1590.0 + 1597.0:  # ... 1,597 s more without one is not
        clock.t += 0.05
        meter.step()
    assert meter.overdue().startswith("no group finished for 1597 s, over the limit 1596 s")


@pytest.fixture
def store():
    s = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=10))
    yield s


def _rank(store, rank: int, errors: dict, work, stall_s: float = 1.0, said: list | None = None):
    board = StoreBoard(
        dist.PrefixStore("t", store),
        rank,
        2,
        stall_s=stall_s,
        poll_s=0.05,
        say_every_s=0.5,
        say=(said.append if said is not None else lambda _: None),
    )
    board.begin()
    try:
        work(board)
        board.wait_all()
    except RuntimeError as err:
        errors[rank] = str(err)
        errors[f"{rank} at"] = time.monotonic()


def _run(store, work0, work1, **kw) -> tuple[dict, list]:
    errors, said = {}, []
    threads = [
        threading.Thread(target=_rank, args=(store, 0, errors, work0), kwargs={**kw, "said": said}),
        threading.Thread(target=_rank, args=(store, 1, errors, work1), kwargs=kw),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return errors, said


def _quick(board):
    board.beat({"steps": 1, "groups": 1, "done": True})


def _slow(seconds: float, beat: bool):
    def work(board):
        t0 = time.monotonic()
        steps = 0
        while time.monotonic() - t0 < seconds:
            steps += 1
            if beat:
                board.beat({"steps": steps, "groups": 0, "limit_s": 100}, force=True)
            time.sleep(0.05)
        board.beat({"steps": steps, "groups": 1, "done": True})

    return work


def test_a_rank_sampling_longer_than_the_stall_window_passes_while_it_shows_progress(store):
    errors, said = _run(store, _quick, _slow(2.5, beat=True), stall_s=1.0)  # 2.5 s of work, a 1 s window
    assert errors == {}
    assert any("rank 1 sampling" in line for line in said)  # rank 0 said what it waits for


def test_a_rank_that_shows_no_progress_fails_the_op_on_the_rank_waiting_for_it_naming_it(store):
    t0 = time.monotonic()
    errors, _ = _run(store, _quick, _slow(6.0, beat=False), stall_s=1.0)  # rank 1 silent for 6 s
    assert errors[0].startswith("SAMPLE op: learner rank(s) [1] showed no progress for 1 s")
    assert errors["0 at"] - t0 < 3.0  # within the window, not at rank 1's end


def test_a_rank_past_its_limit_fails_the_op_on_every_rank_with_its_reason(store):
    def failing(board):
        board.beat({"steps": 9, "groups": 0, "failed": "no group finished for 99 s, over the limit 90 s"})

    errors, _ = _run(store, _quick, failing, stall_s=5.0)
    assert errors[0] == errors[1] == "SAMPLE op: learner rank 1: no group finished for 99 s, over the limit 90 s"


def _beating_rank(store, rank: int, errors: dict, block, *, limit_s: float, stall_s: float) -> None:
    board = StoreBoard(dist.PrefixStore("e", store), rank, 2, stall_s=stall_s, poll_s=0.05, say=lambda _: None)
    board.begin("EVALUATE")
    try:
        with beating(board, limit_s=limit_s, what="sampling its held-out share", every_s=0.1):
            block()
        board.wait_all()
    except RuntimeError as err:
        errors[rank] = str(err)
        errors[f"{rank} at"] = time.monotonic()


def _run_beating(store, block1, **kw) -> dict:
    errors: dict = {}
    threads = [
        threading.Thread(target=_beating_rank, args=(store, r, errors, block), kwargs=kw)
        for r, block in ((0, lambda: None), (1, block1))
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return errors


def test_a_rank_in_one_long_call_stays_alive_on_the_board_past_the_stall_window(store):
    errors = _run_beating(store, lambda: time.sleep(2.5), limit_s=60.0, stall_s=1.0)  # silent 2.5 s, a 1 s window
    assert errors == {}


def test_the_progress_line_names_what_each_rank_is_doing():
    assert progress_of({"steps": 7, "groups": 2, "limit_s": 90}) == "sampling (2 groups, 7 steps, limit 90 s)"
    assert progress_of({"steps": 9, "groups": 3, "done": True}) == "done (3 groups, 9 steps, limit ? s)"
    evaluating = {"what": "sampling its held-out share", "seconds": 12.4, "limit_s": 7200.0, "done": False}
    assert progress_of(evaluating) == "sampling its held-out share (12 s, limit 7200.0 s)"
    assert progress_of({**evaluating, "done": True}) == "done (12 s, limit 7200.0 s)"
    assert progress_of({}) == "nothing reported yet"


def test_a_rank_past_its_evaluation_limit_fails_the_op_on_the_waiting_rank_before_its_call_ends(store):
    t0 = time.monotonic()
    errors = _run_beating(store, lambda: time.sleep(4.0), limit_s=0.5, stall_s=10.0)
    assert errors[0].startswith("EVALUATE op: learner rank 1: sampling its held-out share: still running after ")
    assert errors[0].endswith("over the limit 0 s") and errors["0 at"] - t0 < 2.5  # not at rank 1's end (4 s)
    # rank 1's call returned after its limit: it fails too (its board still says failed), never `done`
    assert errors[1].startswith("sampling its held-out share: still running after ") and errors["1 at"] - t0 >= 4.0


def test_a_rank_whose_call_raises_fails_the_op_on_every_rank_with_the_reason(store):
    def raising():
        raise RuntimeError("CUDA out of memory")

    errors = _run_beating(store, raising, limit_s=60.0, stall_s=10.0)
    assert errors[0] == "EVALUATE op: learner rank 1: sampling its held-out share: RuntimeError: CUDA out of memory"
    assert errors[1] == "CUDA out of memory"
