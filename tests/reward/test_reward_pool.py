"""ScoringPool: crashes and hangs in a worker give reward 0 with a reason; later items score."""

import asyncio
import os
import signal
import time

import pytest

from reward.scoring_pool import ScoringPool, ScoringPoolConfig
from reward.verifiers.compose import RewardResult


def double(x: float) -> float:
    return 2 * x


def crash_worker() -> float:
    os._exit(3)


def hang() -> float:
    while True:
        pass


def raise_error() -> float:
    raise KeyError("missing")


def partial() -> RewardResult:
    return RewardResult(reward=0.5, components={"a": 0.5})


def _run(coro_fn, **config):
    async def main():
        async with ScoringPool(ScoringPoolConfig(workers=1, **config)) as pool:
            return await coro_fn(pool)

    return asyncio.run(main())


def test_value_of_the_verifier_comes_back_as_a_reward():
    assert _run(lambda pool: pool.score(double, 0.25)) == RewardResult(reward=0.5)


def test_reward_result_of_the_verifier_is_kept():
    assert _run(lambda pool: pool.score(partial)) == partial()


def test_exception_in_the_verifier_gives_zero_with_the_reason():
    result = _run(lambda pool: pool.score(raise_error))
    assert (result.reward, result.error) == (0.0, "KeyError: 'missing'")


def test_crashed_worker_gives_zero_and_the_next_item_still_scores():
    async def body(pool):
        return [await pool.score(crash_worker), await pool.score(double, 1.0), pool.restarts]

    crashed, after, restarts = _run(body)
    assert (crashed.reward, crashed.error) == (0.0, "worker died (exit code 3)")
    assert after == RewardResult(reward=2.0)
    assert restarts == 1


def test_hanging_verifier_is_killed_at_the_timeout_and_the_next_item_still_scores():
    async def body(pool):
        start = time.monotonic()
        hung = await pool.score(hang, timeout_s=0.5)
        return hung, time.monotonic() - start, await pool.score(double, 1.5)

    hung, elapsed, after = _run(body)
    assert (hung.reward, hung.error) == (0.0, "timed out after 0.5 s")
    assert elapsed < 10  # the verifier never returns: any bound shows it was killed; slack for a loaded CI box
    assert after == RewardResult(reward=3.0)


def test_event_loop_keeps_running_while_items_are_scored():
    async def body(pool):
        ticks = 0

        async def ticker():
            nonlocal ticks
            while True:
                await asyncio.sleep(0.01)
                ticks += 1

        task = asyncio.create_task(ticker())
        await pool.score(hang, timeout_s=0.5)
        task.cancel()
        return ticks

    assert _run(body) >= 10


def test_concurrent_items_beyond_the_worker_count_all_score():
    async def body(pool):
        return await asyncio.gather(*(pool.score(double, float(i)) for i in range(6)))

    results = _run(
        body,
    )
    assert [r.reward for r in results] == [0.0, 2.0, 4.0, 6.0, 8.0, 10.0]


def test_score_before_start_names_the_fix():
    with pytest.raises(RuntimeError, match="async with ScoringPool"):
        asyncio.run(ScoringPool().score(double, 1.0))


def test_worker_killed_while_idle_is_replaced_on_its_next_item():
    async def body(pool):
        (pid,) = pool.pids
        os.kill(pid, signal.SIGKILL)
        await asyncio.sleep(0.2)
        return await pool.score(double, 1.0), await pool.score(double, 2.0)

    lost, after = _run(body)
    assert lost.reward == 0.0 and lost.error.startswith("worker died")
    assert after == RewardResult(reward=4.0)
