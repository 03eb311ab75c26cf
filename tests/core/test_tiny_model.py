"""The tiny-model builder: tokenizer, HF directory, cache, determinism, and (slow) the default build's
partially-learned regime."""

import json
import math
import shutil
from pathlib import Path

import pytest
import torch

import stare.models.tiny as tiny
import stare.models.tiny.build as tiny_build  # the module whose _build the reuse tests replace
from stare.data.tasks.arithmetic import ALPHABET, ArithmeticTask

# A build small enough for unit tests (a few seconds on one core): it exercises every step of the
# builder but learns next to nothing.
SMALL = dict(
    hidden_size=32,
    num_layers=1,
    num_heads=2,
    num_kv_heads=1,
    intermediate_size=64,
    sft_max_steps=6,
    sft_batch_size=16,
    sft_check_every=3,
    sft_target_accuracy=2.0,
    n_val=8,
    n_eval=16,
)


@pytest.fixture(scope="module")
def small_dir(tmp_path_factory):
    return tiny.build_tiny_model(tmp_path_factory.mktemp("tiny") / "small", **SMALL)


def test_tokenizer_round_trips_task_text():
    tok = tiny.build_tokenizer([ALPHABET])
    task = ArithmeticTask()
    for p in task.problems("train", 50, seed=0):
        text = p.prompt + task.solution(p)
        ids = tok.encode(text, add_special_tokens=False)
        assert len(ids) == len(text)  # one token per character
        assert tok.decode(ids) == text


def test_tokenizer_special_ids_and_vocab():
    tok = tiny.build_tokenizer([ALPHABET])
    assert (tok.pad_token_id, tok.eos_token_id, tok.unk_token_id) == (0, 1, 2)
    assert len(tok) == 3 + len(set(ALPHABET))
    assert tok.encode("1<eos>", add_special_tokens=False) == [tok.convert_tokens_to_ids("1"), 1]
    assert tok.decode([tok.convert_tokens_to_ids("7"), 1, 0, 0], skip_special_tokens=True) == "7"
    assert tok.encode("x", add_special_tokens=False) == [tok.unk_token_id]


def test_saved_directory_loads_like_a_checkpoint(small_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(small_dir)
    tok = AutoTokenizer.from_pretrained(small_dir)
    assert model.config.model_type == "qwen2"
    assert model.config.vocab_size == len(tok)
    assert next(model.parameters()).dtype == torch.float32
    assert tok.padding_side == "left"
    assert model.generation_config.eos_token_id == tok.eos_token_id
    assert model.generation_config.pad_token_id == tok.pad_token_id
    assert tok.decode(tok.encode("3+5*2=", add_special_tokens=False)) == "3+5*2="
    assert (small_dir / "model.safetensors").exists()


def test_loaded_model_generates_and_stops_within_the_budget(small_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(small_dir)
    tok = AutoTokenizer.from_pretrained(small_dir)
    enc = tok(["3+5*2=", "12-3="], return_tensors="pt", padding=True, add_special_tokens=False)
    out = model.generate(**enc, max_new_tokens=8, do_sample=False)
    assert out.shape[0] == 2 and out.shape[1] <= enc["input_ids"].shape[1] + 8


def test_build_info_records_the_build(small_dir):
    info = json.loads((small_dir / "build_info.json").read_text())
    spec = tiny.TinyModelSpec(**SMALL)
    assert info["args_hash"] == spec.args_hash()
    assert info["spec"]["seed"] == 0 and info["spec"]["hidden_size"] == 32
    assert info["sft_steps"] == SMALL["sft_max_steps"]  # target 2.0: never stops early
    assert info["num_parameters"] == sum(p.numel() for p in _load(small_dir).parameters())
    assert set(info["eval"]) >= {"greedy_accuracy", "greedy_accuracy_by_level", "sample_entropy"}
    assert info["eval"]["n"] == SMALL["n_eval"]
    assert info["eval"]["sample_entropy"] > 0


def test_second_build_reuses_the_directory(small_dir, monkeypatch):
    def no_training(*args, **kwargs):
        raise AssertionError("a matching build must be reused, not rebuilt")

    monkeypatch.setattr(tiny_build, "_build", no_training)
    assert tiny.build_tiny_model(small_dir, **SMALL) == small_dir


def test_changed_arguments_rebuild(small_dir, tmp_path, monkeypatch):
    copy = shutil.copytree(small_dir, tmp_path / "copy")
    calls = []
    monkeypatch.setattr(tiny_build, "_build", lambda spec, out, verbose: (calls.append(spec), out.mkdir()))
    tiny.build_tiny_model(copy, **{**SMALL, "sft_max_steps": 7})
    assert [spec.sft_max_steps for spec in calls] == [7]


def test_builds_are_deterministic(small_dir, tmp_path):
    from safetensors.torch import load_file

    again = tiny.build_tiny_model(tmp_path / "again", **SMALL)
    a, b = load_file(small_dir / "model.safetensors"), load_file(again / "model.safetensors")
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_refuses_to_overwrite_a_foreign_directory(tmp_path):
    (tmp_path / "precious.txt").write_text("keep me")
    with pytest.raises(FileExistsError, match="build_info.json"):
        tiny.build_tiny_model(tmp_path, **SMALL)
    assert (tmp_path / "precious.txt").read_text() == "keep me"


def test_default_location_follows_stare_cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("STARE_CACHE_DIR", str(tmp_path))
    spec = tiny.TinyModelSpec()
    assert tiny.default_model_dir(spec).parent == tmp_path / "models"
    monkeypatch.delenv("STARE_CACHE_DIR")
    assert tiny.default_cache_dir() == Path.home() / ".cache" / "stare" / "models"


def test_spec_rejects_inconsistent_shapes():
    with pytest.raises(ValueError, match="divisible"):
        tiny.TinyModelSpec(hidden_size=30, num_heads=4)
    with pytest.raises(ValueError, match="n_eval"):
        tiny.TinyModelSpec(n_eval=0)


def test_response_mask_by_hand():
    eos = 1
    new = torch.tensor([[5, 6, 1, 0, 0], [5, 1, 7, 1, 0], [5, 6, 7, 8, 9]])  # [B, T]
    expected = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 0, 0, 0], [1, 1, 1, 1, 1]]).float()
    assert torch.equal(tiny.response_mask(new, eos), expected)


def test_evaluate_entropy_of_a_uniform_policy(small_dir):
    # Zero output weights make every next-token distribution uniform over the vocabulary, so the
    # mean entropy is log(V) exactly, whatever was sampled.
    model, tok = _load(small_dir), _tokenizer(small_dir)
    with torch.no_grad():
        model.lm_head.weight.zero_()  # tied: the input embedding too; still uniform output
    problems = ArithmeticTask().problems("test", 8, seed=0)
    result = tiny.evaluate(model, tok, ArithmeticTask(), problems, max_new_tokens=6)
    assert result.sample_entropy == pytest.approx(math.log(len(tok)), abs=1e-4)
    assert result.mean_response_tokens <= 6


def test_cli_builds_and_prints_the_directory(small_dir, capsys):
    sets = [f"--set={k}={v}" for k, v in SMALL.items()]
    assert tiny.main(["--out", str(small_dir), "--quiet", *sets]) == 0  # matching build: reused
    assert capsys.readouterr().out.strip() == str(small_dir)


def test_cli_rejects_unknown_fields(capsys):
    with pytest.raises(SystemExit):
        tiny.main(["--set", "no_such_field=1"])
    assert "sft_max_steps" in capsys.readouterr().err


@pytest.mark.slow
def test_default_build_is_partially_learned():
    """The default build (cached under STARE_CACHE_DIR) leaves room for RL: held-out greedy
    accuracy strictly inside (0, 1) and real sampling entropy."""
    path = tiny.build_tiny_model()
    info = json.loads((path / "build_info.json").read_text())
    ev = info["eval"]
    assert 0.2 < ev["greedy_accuracy"] < 0.8
    assert 0.0 < ev["sample_accuracy"] < 1.0
    assert ev["sample_entropy"] > 0.15
    assert 1e5 < info["num_parameters"] < 2e6


def _load(path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path)


def _tokenizer(path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)
