"""Rollout engines (HF and vLLM) against an independent HF forward pass on a random tiny Qwen2.

Each property is checked for every engine kind: n completions per prompt, per-token log-probs
equal to a full-sequence recompute (prefix + completion, no padding, no cache), EOS/stop handling,
seed reproducibility, distinct samples for n > 1, and `update_weights` changing the outputs to
exactly what the new weights give (for vLLM this proves that the prefix cache is reset).

The vLLM cases (marked `vllm`) skip where `vllm` is not importable (the main venv); run them in
the vLLM venv: `.venv-vllm/bin/python -m pytest -m vllm tests/rollout/test_rollout_engines.py` (see
docs/rollout-engines.md).
One vLLM engine is shared per module (it takes seconds to start) and is left with the weights it
was built with after every test that changes them.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from rollout.engines.base import Completion, RolloutEngine, SamplingParams, StreamingEngine, read_eos_token_ids
from rollout.engines.registry import HFEngineConfig, build_engine

VOCAB = 64
PAD, EOS, UNK = 0, 1, 2
# Prompts of different lengths, so left padding (HF) and ragged batches (vLLM) are exercised.
PROMPTS = [[5, 9, 13, 21, 34], [7], [3, 3, 3, 3, 3, 3, 3, 3, 40, 41, 42], [60, 2, 17]]
# Longer than vLLM's CPU KV block (128 tokens): only full blocks enter its prefix cache, so this
# prompt is what would reuse stale KV after a weight update if the cache were not reset.
LONG_PROMPT = [(7 * i) % 61 + 3 for i in range(140)]

# Tolerances on |engine logprob - recompute|, measured on this model (see docs/rollout-engines.md):
# HF fp32 differs from the recompute only by cached-vs-full attention summation order (~1e-6);
# vLLM fp32 uses its own CPU kernels (~1e-5).
ATOL = {"hf": 1e-4, "vllm": 1e-3}


# --- the tiny model --------------------------------------------------------------------------


def build_tiny_model(path: Path, *, tie_word_embeddings: bool, seed: int = 0) -> Path:
    """A random-init 2-layer Qwen2 (~0.1M params, head_dim 32) + a character-level tokenizer, saved as a HF dir.

    initializer_range 0.1 makes next-token distributions far from uniform (entropy ~3 nats
    instead of log 64 = 4.16), which makes log-prob mismatches visible, while EOS (p ~ 1/64 per
    step) still ends a fair share of 64-token completions.
    """
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import GenerationConfig, PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    path.mkdir(parents=True, exist_ok=True)
    chars = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 "  # 63 - 2 = 61 used
    vocab = {"<pad>": PAD, "<eos>": EOS, "<unk>": UNK}
    for c in chars[: VOCAB - len(vocab)]:
        vocab[c] = len(vocab)
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
    PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>", padding_side="left"
    ).save_pretrained(path)

    # head_dim = 64 / 2 = 32: vLLM's CPU attention supports head sizes 32, 64, 80, ... (not 16).
    config = Qwen2Config(
        vocab_size=VOCAB,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        intermediate_size=128,
        max_position_embeddings=256,
        tie_word_embeddings=tie_word_embeddings,
        initializer_range=0.1,
        eos_token_id=EOS,
        pad_token_id=PAD,
        bos_token_id=None,
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config).float()
    model.save_pretrained(path, safe_serialization=True)
    GenerationConfig(eos_token_id=EOS, pad_token_id=PAD).save_pretrained(path)
    return path


def perturbed_state_dict(path: Path, seed: int) -> dict[str, torch.Tensor]:
    """`state_dict()` of the model at `path` with every parameter moved by N(0, 0.05^2).

    Like a learner's state dict: a tied model lists `lm_head.weight` and the embedding, equal.
    """
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():  # each shared tensor once
            p.add_(0.05 * torch.randn(p.shape, generator=g))
    return {k: v.clone() for k, v in model.state_dict().items()}


def recompute_logprobs(
    model_or_path, prompt: list[int], completion: list[int], temperature: float = 1.0, top_p: float = 1.0
) -> torch.Tensor:
    """Log-probs of `completion` after `prompt` from one uncached, unpadded HF forward pass.

    The top-p nucleus comes from transformers' own `TopPLogitsWarper`, not from the engine code.
    """
    from transformers import AutoModelForCausalLM
    from transformers.generation.logits_process import TopPLogitsWarper

    model = model_or_path
    if not isinstance(model, torch.nn.Module):
        model = AutoModelForCausalLM.from_pretrained(model_or_path, dtype=torch.float32)
    ids = torch.tensor([prompt + completion])  # [1, Lp + Lc]
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1 : -1].float()  # [Lc, V]
    if temperature > 0:
        logits = logits / temperature
    if top_p < 1.0:
        logits = TopPLogitsWarper(top_p)(ids, logits)
    logp = torch.log_softmax(logits, dim=-1)  # [Lc, V]
    return logp.gather(-1, torch.tensor(completion)[:, None]).squeeze(-1)  # [Lc]


# --- fixtures --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny_tied"), tie_word_embeddings=True)


@pytest.fixture(scope="module")
def untied_model_dir(tmp_path_factory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny_untied"), tie_word_embeddings=False, seed=1)


@pytest.fixture(scope="module")
def ref_model(model_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)


_VLLM_ENGINES: dict[Path, RolloutEngine] = {}


def _make_engine(kind: str, path: Path) -> RolloutEngine:
    if kind == "hf":
        return build_engine(HFEngineConfig(model_path=str(path)))
    pytest.importorskip("vllm")
    if path not in _VLLM_ENGINES:  # one per model dir and session: vLLM starts in seconds
        _VLLM_ENGINES[path] = build_engine({"name": "vllm", "model_path": str(path), "max_model_len": 256})
    return _VLLM_ENGINES[path]


@pytest.fixture(scope="module", autouse=True)
def _close_vllm_engines():
    yield
    for engine in _VLLM_ENGINES.values():
        engine.close()
    _VLLM_ENGINES.clear()


@pytest.fixture(params=["hf", pytest.param("vllm", marks=pytest.mark.vllm)])
def kind(request) -> str:
    return request.param


@pytest.fixture
def engine(kind, model_dir) -> RolloutEngine:
    return _make_engine(kind, model_dir)


def _assert_well_formed(groups: list[list[Completion]], n: int, params: SamplingParams, stop_ids: set[int]) -> None:
    assert len(groups) == len(PROMPTS)
    for group in groups:
        assert len(group) == n
        for c in group:
            assert len(c.token_ids) == len(c.logprobs) >= 1
            assert all(lp <= 0.0 for lp in c.logprobs)
            assert not any(t in stop_ids for t in c.token_ids[:-1]), "token after a stop token"
            if c.finish_reason == "stop":
                assert c.token_ids[-1] in stop_ids
            else:
                assert c.finish_reason == "length"
                assert len(c.token_ids) == params.max_new_tokens
                assert c.token_ids[-1] not in stop_ids


# --- tests -----------------------------------------------------------------------------------


def test_engine_satisfies_protocol(engine):
    assert isinstance(engine, RolloutEngine)


def test_n_completions_per_prompt_with_matching_logprobs(engine, kind, model_dir, ref_model):
    params = SamplingParams(n=3, max_new_tokens=12, seed=1)
    groups = engine.generate(PROMPTS, params)
    _assert_well_formed(groups, 3, params, {EOS})
    worst = 0.0
    for prompt, group in zip(PROMPTS, groups):
        for c in group:
            ref = recompute_logprobs(ref_model, prompt, c.token_ids)
            worst = max(worst, (torch.tensor(c.logprobs) - ref).abs().max().item())
    assert worst < ATOL[kind], f"max |logprob - recompute| = {worst:.2e}"


@pytest.mark.parametrize("temperature,top_p", [(0.7, 1.0), (1.3, 0.8)])
def test_logprobs_are_of_the_sampling_distribution(engine, kind, ref_model, temperature, top_p):
    # At T != 1 the log-probs are log_softmax(logits / T), renormalised over the top-p nucleus.
    params = SamplingParams(n=2, max_new_tokens=10, temperature=temperature, top_p=top_p, seed=2)
    groups = engine.generate(PROMPTS, params)
    for prompt, group in zip(PROMPTS, groups):
        for c in group:
            ref = recompute_logprobs(ref_model, prompt, c.token_ids, temperature, top_p)
            assert torch.isfinite(ref).all(), "sampled a token outside the top-p nucleus"
            torch.testing.assert_close(torch.tensor(c.logprobs), ref, atol=ATOL[kind], rtol=0)


def test_samples_follow_the_sampling_distribution(engine, ref_model):
    # 4000 one-token samples of one prompt at T=0.5, top_p=0.8 (19 tokens in the nucleus): their
    # histogram is within total variation 0.06 of softmax(logits / 0.5) on the nucleus. Exact
    # multinomial draws of that size land at TV 0.023-0.041 (10 seeds, measured); the T=1
    # distribution is 0.30 away, so a wrong temperature or nucleus fails.
    from transformers.generation.logits_process import TopPLogitsWarper

    prompt, n = [5, 9, 13], 4000
    groups = engine.generate([prompt], SamplingParams(n=n, max_new_tokens=1, temperature=0.5, top_p=0.8, seed=5))
    counts = torch.bincount(torch.tensor([c.token_ids[0] for c in groups[0]]), minlength=VOCAB).float()
    with torch.no_grad():
        logits = ref_model(torch.tensor([prompt])).logits[:, -1].float()  # [1, V]

    def dist(temperature):
        return torch.softmax(TopPLogitsWarper(0.8)(None, logits / temperature), dim=-1)[0]  # [V]

    tv = 0.5 * (counts / n - dist(0.5)).abs().sum().item()
    tv_wrong = 0.5 * (counts / n - dist(1.0)).abs().sum().item()
    assert tv < 0.06, f"TV(samples, expected) = {tv:.3f}"
    assert tv_wrong > 0.15, f"the test cannot tell T=0.5 from T=1 (TV {tv_wrong:.3f})"


def test_greedy_is_argmax_with_raw_logprobs(engine, kind, ref_model):
    params = SamplingParams(n=2, max_new_tokens=8, temperature=0.0, seed=0)
    groups = engine.generate(PROMPTS, params)
    for prompt, group in zip(PROMPTS, groups):
        assert group[0].token_ids == group[1].token_ids
        ids = torch.tensor([prompt + group[0].token_ids])
        with torch.no_grad():
            logits = ref_model(ids).logits[0, len(prompt) - 1 : -1]  # [Lc, V]
        assert group[0].token_ids == logits.argmax(-1).tolist()
        ref = recompute_logprobs(ref_model, prompt, group[0].token_ids)
        torch.testing.assert_close(torch.tensor(group[0].logprobs), ref, atol=ATOL[kind], rtol=0)


def test_stops_at_eos_and_includes_it(engine):
    # p(EOS) ~ 1/64 per step: over 64 tokens about half the completions stop, half hit the limit.
    params = SamplingParams(n=8, max_new_tokens=64, seed=3)
    groups = engine.generate(PROMPTS, params)
    _assert_well_formed(groups, 8, params, {EOS})
    reasons = [c.finish_reason for g in groups for c in g]
    assert "stop" in reasons and "length" in reasons
    assert all(c.token_ids[-1] == EOS for g in groups for c in g if c.finish_reason == "stop")


def test_extra_stop_token_ids(engine, ref_model):
    stop = (10, 11, 12, 13, 14, 15)
    params = SamplingParams(n=4, max_new_tokens=40, seed=4, stop_token_ids=stop)
    groups = engine.generate(PROMPTS, params)
    _assert_well_formed(groups, 4, params, {EOS, *stop})
    assert any(c.token_ids[-1] in stop for g in groups for c in g)


def test_same_seed_same_samples_and_n_samples_differ(engine):
    params = SamplingParams(n=4, max_new_tokens=16, seed=123)
    a = engine.generate(PROMPTS, params)
    b = engine.generate(PROMPTS, params)
    assert [[c.token_ids for c in g] for g in a] == [[c.token_ids for c in g] for g in b]
    for group in a:
        assert len({tuple(c.token_ids) for c in group}) == 4, "n samples of one prompt coincide"
    c = engine.generate(PROMPTS, SamplingParams(n=4, max_new_tokens=16, seed=124))
    assert [[x.token_ids for x in g] for g in a] != [[x.token_ids for x in g] for g in c]


def test_streamed_prompts_get_what_generate_gives_them(engine):
    """StreamingEngine: each prompt added with its own seed comes back (in any order, as its n
    samples end) with the completions `generate` gives it with that seed; greedy ones too."""
    assert isinstance(engine, StreamingEngine)
    seeds = (11, 22, 33, 44)
    want = engine.generate(PROMPTS, SamplingParams(n=3, max_new_tokens=40, prompt_seeds=seeds))
    want_greedy = engine.generate(PROMPTS[:1], SamplingParams(n=2, max_new_tokens=8, temperature=0))
    for i, prompt in enumerate(PROMPTS):
        engine.add(prompt, SamplingParams(n=3, max_new_tokens=40, prompt_seeds=(seeds[i],)), key=i)
    engine.add(PROMPTS[0], SamplingParams(n=2, max_new_tokens=8, temperature=0), key="greedy")
    assert engine.pending() == 5
    got = {}
    for _ in range(100):
        if not engine.pending():
            break
        got.update(engine.step())
    assert sorted(got, key=str) == sorted([0, 1, 2, 3, "greedy"], key=str) and engine.pending() == 0
    for i in range(len(PROMPTS)):
        assert [c.token_ids for c in got[i]] == [c.token_ids for c in want[i]]
        for a, b in zip(got[i], want[i]):
            assert a.finish_reason == b.finish_reason
            torch.testing.assert_close(torch.tensor(a.logprobs), torch.tensor(b.logprobs), rtol=0, atol=1e-6)
    assert [c.token_ids for c in got["greedy"]] == [c.token_ids for c in want_greedy[0]]


def test_generate_and_weight_updates_wait_for_streamed_prompts(kind, model_dir):
    engine = _make_engine(kind, model_dir)
    engine.add(PROMPTS[0], SamplingParams(n=2, max_new_tokens=4, seed=0), key="k")
    if kind == "vllm":  # its generate() runs the engine to the end: it would take the streamed outputs
        with pytest.raises(RuntimeError, match="streaming"):
            engine.generate(PROMPTS[:1], SamplingParams(n=1, max_new_tokens=4, seed=0))
    with pytest.raises(RuntimeError, match="streaming"):
        engine.update_weights(perturbed_state_dict(model_dir, seed=3), version=1)
    assert engine.weight_version == 0
    while engine.pending():
        engine.step()


@pytest.mark.vllm
def test_vllm_capacity_is_max_num_seqs_bounded_by_the_kv_cache(model_dir):
    engine = _make_engine("vllm", model_dir)
    # 1 GiB of fp32 KV (cpu_kvcache_space_gib 1) over 2 layers x 1 KV head x head_dim 32 x (K and V):
    tokens = 2**30 // (2 * 2 * 1 * 32 * 4)  # 2,097,152 (vLLM logs the same)
    vc = engine.llm.llm_engine.vllm_config
    assert vc.cache_config.num_gpu_blocks * vc.cache_config.block_size == tokens  # what capacity() reads
    assert engine.capacity() == min(256, tokens // 256)  # max_num_seqs 256 < 8,192 sequences of max_model_len 256


@pytest.mark.parametrize("variant", ["tied", "tied-no-head", "untied"])
def test_update_weights_changes_outputs_to_the_new_policy(kind, variant, model_dir, untied_model_dir):
    path = untied_model_dir if variant == "untied" else model_dir
    engine = _make_engine(kind, path)
    prompts = PROMPTS + [LONG_PROMPT]
    params = SamplingParams(n=2, max_new_tokens=12, temperature=0.0)
    before = engine.generate(prompts, params)  # fills vLLM's prefix cache with the old weights' KV
    new_sd = perturbed_state_dict(path, seed=7)
    assert "lm_head.weight" in new_sd  # HF `state_dict()` lists a tied head too
    if variant == "tied-no-head":
        del new_sd["lm_head.weight"]  # tied: the embedding carries it, a tied checkpoint omits it
    engine.update_weights(new_sd, version=5)
    assert engine.weight_version == 5
    try:
        after = engine.generate(prompts, params)
        from transformers import AutoModelForCausalLM

        new_model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
        new_model.load_state_dict(new_sd, strict=False)
        for prompt, group in zip(prompts, after):
            ref = recompute_logprobs(new_model, prompt, group[0].token_ids)
            torch.testing.assert_close(torch.tensor(group[0].logprobs), ref, atol=ATOL[kind], rtol=0)
        assert [g[0].token_ids for g in after] != [g[0].token_ids for g in before]
    finally:  # shared vLLM engines go back to the weights they were built with
        from safetensors.torch import load_file

        engine.update_weights(load_file(str(path / "model.safetensors")), version=0)
    again = engine.generate(prompts, params)
    assert [g[0].token_ids for g in again] == [g[0].token_ids for g in before]


def test_update_weights_rejects_foreign_names(kind, model_dir):
    engine = _make_engine(kind, model_dir)
    sd = perturbed_state_dict(model_dir, seed=0)
    with pytest.raises((KeyError, ValueError)):
        engine.update_weights({"module." + k: v for k, v in sd.items()}, version=1)
    assert engine.weight_version == 0


def test_rejects_prompts_that_do_not_fit(engine):
    with pytest.raises(ValueError, match="max_model_len"):
        engine.generate([[5] * 250], SamplingParams(n=1, max_new_tokens=10))  # 260 > 256 positions
    with pytest.raises(ValueError, match="outside"):
        engine.generate([[VOCAB]], SamplingParams(n=1, max_new_tokens=4))
    with pytest.raises(ValueError, match="empty"):
        engine.generate([[]], SamplingParams(n=1, max_new_tokens=4))


def test_hf_chunking_gives_the_same_completions(model_dir):
    # max_batch_size splits the work; the greedy result must not depend on the split.
    params = SamplingParams(n=3, max_new_tokens=10, temperature=0.0)
    whole = build_engine(HFEngineConfig(model_path=str(model_dir))).generate(PROMPTS, params)
    split = build_engine(HFEngineConfig(model_path=str(model_dir), max_batch_size=3)).generate(PROMPTS, params)
    assert [[c.token_ids for c in g] for g in whole] == [[c.token_ids for c in g] for g in split]


def test_build_engine_lists_valid_names(model_dir):
    with pytest.raises(ValueError, match=r"valid names: \['hf', 'vllm'\]"):
        build_engine({"name": "sglang", "model_path": str(model_dir)})


def test_read_eos_token_ids(model_dir, tmp_path):
    assert read_eos_token_ids(model_dir) == (EOS,)
    (tmp_path / "config.json").write_text(json.dumps({"eos_token_id": [3, 4]}))
    assert read_eos_token_ids(tmp_path) == (3, 4)
    (tmp_path / "config.json").write_text(json.dumps({}))
    with pytest.raises(ValueError, match="eos_token_id"):
        read_eos_token_ids(tmp_path)


def test_sampling_params_validation():
    with pytest.raises(ValueError, match="top_p"):
        SamplingParams(n=1, max_new_tokens=4, top_p=0.0)
    with pytest.raises(ValueError, match="n must be"):
        SamplingParams(n=0, max_new_tokens=4)


VLLM_SECTION = {
    "name": "vllm",
    "tensor_parallel_size": 1,
    "max_num_seqs": 7,
    "max_num_batched_tokens": 512,
    "enable_prefix_caching": False,
    "max_model_len": 256,
    "enforce_eager": True,
    "gpu_memory_utilization": 0.3,
}


def test_the_vllm_section_becomes_the_engine_arguments_without_importing_vllm(model_dir):
    from rollout.engines.registry import VLLMEngineConfig
    from rollout.engines.vllm_args import engine_args
    from rollout.stack import engine_config
    from stare.config import build_config

    cfg = build_config({"model": {"path": str(model_dir)}, "rollout": {"engine": VLLM_SECTION}})
    config = VLLMEngineConfig.model_validate(engine_config(cfg, model_dir))
    assert engine_args(config) == {k: v for k, v in VLLM_SECTION.items() if k != "name"}
    # None leaves vLLM its own default
    assert "max_num_batched_tokens" not in engine_args(build_config({"rollout": {"engine": "vllm"}}).rollout.engine)


@pytest.mark.parametrize(
    "value,cuda,expected", [(None, False, True), (None, True, False), (True, True, True), (False, False, False)]
)
def test_enforce_eager_auto_means_cuda_graphs_where_cuda_is_present_and_explicit_values_stay(value, cuda, expected):
    from rollout.engines.vllm_args import engine_args
    from stare.config import VllmEngineSection

    assert engine_args(VllmEngineSection(enforce_eager=value), cuda_available=cuda)["enforce_eager"] is expected


def test_enforce_eager_defaults_to_eager_on_this_cpu_machine():
    from rollout.engines.vllm_args import engine_args
    from stare.config import VllmEngineSection

    if torch.cuda.is_available():
        pytest.skip("a CUDA machine: the CPU resolution is checked where there is none")
    assert VllmEngineSection().enforce_eager is None
    assert engine_args(VllmEngineSection())["enforce_eager"] is True


@pytest.mark.parametrize(
    "config",
    [
        "paper/short-cot-qwen2.5-math-7b-stare.yaml",
        "paper/short-cot-qwen2.5-math-7b-grpo-ds.yaml",
        "paper/long-cot-r1-distill-qwen-7b-stare.yaml",
        "paper/tool-use-qwen2.5-7b-instruct-stare.yaml",
        "gpu-node.yaml",
    ],
)
def test_the_gpu_configs_decode_with_cuda_graphs_where_cuda_is_present(config):
    from rollout.engines.vllm_args import engine_args
    from stare.config import load_config

    cfg = load_config(Path(__file__).parents[2] / "configs" / config)
    assert cfg.rollout.engine.name == "vllm"
    assert engine_args(cfg.rollout.engine, cuda_available=True)["enforce_eager"] is False


def test_the_streaming_worker_publishes_what_the_batch_worker_publishes(kind, model_dir):
    """The rollout worker over each engine: batches of 2 prompts (the batch loop) and the streaming
    loop (every prompt in the engine at once, refilled as groups end) sample the same trajectories."""
    from transformers import AutoTokenizer

    from rollout.streaming import StreamingLoop
    from rollout.worker import RolloutWorker
    from stare.transport.in_memory import MemoryTransport
    from stare.transport.records import PromptTask
    from stare.weight_sync.in_memory import MemoryWeightBoard

    engine, tokenizer = _make_engine(kind, model_dir), AutoTokenizer.from_pretrained(model_dir)
    tasks = [
        PromptTask(
            run_id="r",
            group_id=f"g{i}",
            prompt="",
            prompt_token_ids=p,
            answer="",
            problem_id=str(i),
            data_source="d",
            group_size=3,
        )
        for i, p in enumerate(PROMPTS + [LONG_PROMPT[:30], [9, 8]])
    ]
    out = {}
    for mode in ("batch", "stream"):
        t = MemoryTransport()
        t.prompts.publish(tasks)
        worker = RolloutWorker(
            engine,
            tokenizer,
            t.prompts,
            t.raw,
            MemoryWeightBoard(),
            name="w",
            max_new_tokens=24,
            temperature=1.0,
            top_p=1.0,
            stop_token_ids=(),
            seed=5,
        )
        loop = StreamingLoop(worker, engine)
        while t.prompts.backlog():
            worker.run_once(max_prompts=2) if mode == "batch" else loop.run_once()
        out[mode] = {d.record.trajectory_id: d.record for d in t.raw.consume("reader", 100)}
    assert sorted(out["stream"]) == sorted(out["batch"]) and len(out["batch"]) == 6 * 3
    for tid, want in out["batch"].items():
        got = out["stream"][tid]
        assert got.response_token_ids.tolist() == want.response_token_ids.tolist(), tid
        torch.testing.assert_close(
            torch.from_numpy(got.response_logprobs), torch.from_numpy(want.response_logprobs), rtol=0, atol=1e-5
        )


# Before the test below: it builds and closes an engine of its own, which tears down vLLM's in-process
# distributed state that the session's cached engine (_make_engine) still uses.
@pytest.mark.vllm
def test_a_vllm_engine_is_built_with_the_sections_arguments(model_dir):
    pytest.importorskip("vllm")
    from rollout.stack import engine_config
    from stare.config import build_config

    cfg = build_config({"model": {"path": str(model_dir)}, "rollout": {"engine": VLLM_SECTION}})
    engine = build_engine(engine_config(cfg, model_dir))
    try:
        vc = engine.llm.llm_engine.vllm_config
        seen = {
            "tensor_parallel_size": vc.parallel_config.tensor_parallel_size,
            "max_num_seqs": vc.scheduler_config.max_num_seqs,
            "max_num_batched_tokens": vc.scheduler_config.max_num_batched_tokens,
            "enable_prefix_caching": vc.cache_config.enable_prefix_caching,
            "max_model_len": vc.model_config.max_model_len,
            "enforce_eager": vc.model_config.enforce_eager,
            "gpu_memory_utilization": vc.cache_config.gpu_memory_utilization,
        }
        assert seen == {k: v for k, v in VLLM_SECTION.items() if k != "name"}
        groups = engine.generate(PROMPTS[:1], SamplingParams(n=2, max_new_tokens=4, seed=0))
        assert len(groups[0]) == 2
    finally:
        engine.close()
