"""The vLLM engine's life in a process it shares (no vLLM needed: vLLM 0.32's behaviour is stood in for where
cited): its shutdown leaves the learner's default process group alone, a second sleep-mode engine is refused,
and the sleep-mode arguments it passes."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch.distributed as dist

from rollout.engines.vllm_args import default_group_kept, sleep_args
from stare.runtime.net import free_port

ROOT = Path(__file__).resolve().parents[2]


def _with_default_group(check: Callable[[], None]) -> None:
    """`check()` under a one-process gloo default group, as DeepSpeed's init_distributed forms it, destroyed after."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        check()
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def _in_a_fresh_process(check: str) -> None:
    """Run `check` (a function of this file) with a default group in a new Python: this pytest process may
    hold the default group of an earlier in-process learner, which cannot be destroyed here (DeepSpeed keeps
    groups derived from it for the learners that follow)."""
    code = (
        "import importlib.util, sys; spec = importlib.util.spec_from_file_location('lifecycle', sys.argv[1]); "
        "m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m); "
        "m._with_default_group(getattr(m, sys.argv[2])); print('held')"
    )
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
    }
    done = subprocess.run(
        [sys.executable, "-c", code, __file__, check], capture_output=True, text=True, timeout=180, env=env, cwd=ROOT
    )
    assert done.returncode == 0 and done.stdout.strip().endswith("held"), done.stderr[-3000:]


def _vllm_shutdown(own_groups: list):
    """What vLLM 0.32's EngineCore.shutdown does to process groups (vllm/v1/engine/core.py `shutdown` ->
    `cleanup_dist_env_and_memory`; vllm/distributed/parallel_state.py): its own groups destroyed
    (GroupCoordinator.destroy), then `torch.distributed.destroy_process_group()` if initialised."""

    def shutdown():
        for group in own_groups:
            dist.destroy_process_group(group)
        if dist.is_initialized():
            dist.destroy_process_group()

    return shutdown


def _engine(owns: bool, own_groups: list):
    from rollout.engines.vllm_engine import VLLMEngine

    engine = VLLMEngine.__new__(VLLMEngine)  # the engine as built, vLLM stood in for
    core = SimpleNamespace(shutdown=_vllm_shutdown(own_groups))
    engine.llm = SimpleNamespace(llm_engine=SimpleNamespace(engine_core=core))
    engine._owns_default_group = owns
    return engine


def _close_keeps_a_default_group_the_engine_did_not_create_and_destroys_the_engines_own() -> None:
    own = dist.new_group(backend="gloo")  # a group vLLM made (its world / TP coordinator)
    _engine(owns=False, own_groups=[own]).close()
    assert dist.is_initialized()  # the learner's group survives
    dist.barrier()  # and works
    with pytest.raises(KeyError):
        dist.get_process_group_ranks(own)  # vLLM's own group is gone


def _close_destroys_the_default_group_the_engine_created() -> None:
    _engine(owns=True, own_groups=[]).close()
    assert not dist.is_initialized()


def _the_guard_is_undone_after_the_block() -> None:
    original = dist.destroy_process_group
    with default_group_kept(True):
        assert dist.destroy_process_group is not original
    assert dist.destroy_process_group is original


def test_close_keeps_a_default_group_the_engine_did_not_create_and_destroys_the_engines_own():
    _in_a_fresh_process("_close_keeps_a_default_group_the_engine_did_not_create_and_destroys_the_engines_own")


def test_close_destroys_the_default_group_the_engine_created():
    _in_a_fresh_process("_close_destroys_the_default_group_the_engine_created")


def test_the_guard_is_undone_after_the_block():
    _in_a_fresh_process("_the_guard_is_undone_after_the_block")


def test_a_second_sleep_mode_engine_in_one_process_is_refused_before_vllm_is_imported():
    from rollout.engines import vllm_args
    from rollout.engines.vllm_engine import VLLMEngine

    class Live:  # an engine built with sleep mode and not closed
        llm = object()

    live = Live()
    vllm_args.sleeping_engines.add(live)
    try:
        with pytest.raises(RuntimeError, match="a second vLLM engine with sleep mode in one process"):
            VLLMEngine("/nonexistent", sleep_mode=True)
    finally:
        vllm_args.sleeping_engines.discard(live)


@pytest.mark.parametrize(
    "sleep_mode, eager, accepted, expected",
    [
        (
            True,
            False,
            {"sleep_mode_offload_cudagraph"},
            {"enable_sleep_mode": True, "sleep_mode_offload_cudagraph": True},
        ),
        (True, True, {"sleep_mode_offload_cudagraph"}, {"enable_sleep_mode": True}),  # no graphs, no graph pool
        (True, False, set(), {"enable_sleep_mode": True}),  # a vLLM without the field (< 0.32)
        (False, False, {"sleep_mode_offload_cudagraph"}, {}),
    ],
)
def test_a_sleeping_engine_with_cuda_graphs_offloads_their_pool_where_vllm_can(sleep_mode, eager, accepted, expected):
    assert sleep_args(sleep_mode, eager, accepted) == expected
