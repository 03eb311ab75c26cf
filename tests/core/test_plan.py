"""`stare plan` (stare/plan/gpu_memory.py): the arithmetic against hand-derived numbers and DeepSpeed's own
estimators, the verdicts on the shipped GPU configs and the paper's 7B recipe, and the start-up check."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stare.config import ConfigError, build_config, load_config
from stare.plan.check import check_fits
from stare.plan.gpu_memory import GIB, HEADROOM, build_plan
from stare.plan.sizes import load_model_shape, model_state_bytes

REPO = Path(__file__).parents[2]
MODELS = REPO / "configs" / "models"
PAPER_7B = REPO / "configs" / "paper" / "short-cot-qwen2.5-math-7b-stare.yaml"  # the recipe

# A small Qwen2: vocab 100, hidden 16, 2 layers, 4 heads (head_dim 4), 2 kv heads (kv_dim 8), MLP 32, tied.
SMALL = {
    "architectures": ["Qwen2ForCausalLM"],
    "model_type": "qwen2",
    "vocab_size": 100,
    "hidden_size": 16,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 32,
    "max_position_embeddings": 64,
    "tie_word_embeddings": True,
}
# Parameters by hand: embedding 100 x 16 = 1,600 (tied: counted once). Per layer: q 16x16 + 16 bias = 272,
# k and v 16x8 + 8 = 136 each, o 16x16 = 256, gate/up/down 3 x 16x32 = 1,536, two norms 32 -> 2,368.
# Total 1,600 + 2 x 2,368 + 16 (final norm) = 6,352; the largest module is the embedding (1,600).
SMALL_PARAMS, SMALL_LARGEST = 6352, 1600


@pytest.fixture
def small_model(tmp_path) -> Path:
    (tmp_path / "config.json").write_text(json.dumps(SMALL))
    return tmp_path


def small_cfg(model: Path, **optim):
    return build_config(
        {
            "model": {"path": str(model), "dtype": "bfloat16"},
            "task": {"name": "arithmetic"},
            "rollout": {"prompts_per_step": 2, "samples_per_prompt": 2, "max_new_tokens": 6, "engine": "vllm"},
            "optim": {"micro_batch": 2, "zero_stage": 2, "logits_chunk_tokens": 8, **optim},
            "diagnostics": {"predicted_entropy_change": False},
            "system": {
                "rollout_batch_prompts": 1,
                "weight_sync_communicator": "gloo",
            },  # no NCCL send/receive buffers: the hand counts stay small
        }
    )


def test_parameter_count_of_a_small_model_matches_the_hand_count(small_model):
    shape = load_model_shape(small_cfg(small_model))
    assert (shape.params, shape.largest_layer_params) == (SMALL_PARAMS, SMALL_LARGEST)
    assert (shape.head_dim, shape.kv_dim, shape.vocab) == (4, 8, 100)


def test_parameter_count_of_the_7b_shape_matches_the_hand_count():
    h, i, v, kv, layers = 3584, 18944, 152064, 512, 28
    layer = (h * h + h) + 2 * (kv * h + kv) + h * h + 3 * h * i + 2 * h
    expected = 2 * v * h + layers * layer + h  # untied embedding and lm_head, final norm
    shape = load_model_shape(build_config({}), MODELS / "qwen2.5-math-7b.json")
    assert shape.params == expected == 7_615_616_512
    assert shape.largest_layer_params == v * h


def test_meta_device_count_equals_deepspeeds_count_on_the_real_model(small_model):
    """DeepSpeed's model_to_params walks real tensors; ours builds the model on the meta device."""
    from deepspeed.runtime.zero.stage3 import model_to_params
    from transformers import AutoConfig, AutoModelForCausalLM

    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(small_model))
    shape = load_model_shape(small_cfg(small_model))
    assert model_to_params(model) == (shape.params, shape.largest_layer_params)


@pytest.mark.parametrize(
    "stage, expected",
    [
        (0, 20 * SMALL_PARAMS),  # nothing sharded: 2 + 2 + 4 + 4 + 8 bytes per parameter
        (1, 4 * SMALL_PARAMS + 16 * SMALL_PARAMS // 2),  # 16-bit weights and grads whole, 16 bytes sharded
        (2, 2 * SMALL_PARAMS + 18 * SMALL_PARAMS // 2),  # DeepSpeed: 2P + 18P/N
        (3, 4 * SMALL_LARGEST + 18 * SMALL_PARAMS // 2),  # DeepSpeed: 4 x largest layer + 18P/N
    ],
)
def test_mixed_precision_model_states_by_hand(stage, expected):
    assert model_state_bytes(SMALL_PARAMS, SMALL_LARGEST, stage=stage, gpus=2, dtype_bytes=2)[0] == expected


@pytest.mark.parametrize(
    "stage, expected", [(0, 16 * 6352), (1, 8 * 6352 + 4 * 6352), (2, 4 * 6352 + 6 * 6352), (3, 8 * 6352 + 4 * 1600)]
)
def test_fp32_model_states_by_hand(stage, expected):
    assert model_state_bytes(SMALL_PARAMS, SMALL_LARGEST, stage=stage, gpus=2, dtype_bytes=4)[0] == expected


@pytest.mark.parametrize("gpus", [1, 8, 16])
def test_zero2_and_zero3_are_deepspeeds_estimates(gpus):
    from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs
    from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs

    P, L = 7_615_616_512, 544_997_376
    z2 = estimate_zero2_model_states_mem_needs(P, num_gpus_per_node=gpus, cpu_offload=False)[1]
    z3 = estimate_zero3_model_states_mem_needs(
        P, L, num_gpus_per_node=gpus, cpu_offload=False, cpu_offload_params=False
    )[1]
    assert model_state_bytes(P, L, stage=2, gpus=gpus, dtype_bytes=2)[0] == z2
    assert model_state_bytes(P, L, stage=3, gpus=gpus, dtype_bytes=2)[0] == z3
    assert z3 == 4 * L + 18 * P // gpus  # and those are what their source says


def test_learner_items_by_hand(small_model):
    # rows per rank 2 x 2 = 4, micro-batch 2 rows of 10 prompt + 6 response = 32 tokens (b = 2 bytes)
    # one layer per token: 2 (4x16 + 4 + 2x2x16) + 2 (2x16 + 2x8) + 4x4 + 4x2x32 = 264 + 96 + 16 + 256 = 632 B
    plan = build_plan(small_cfg(small_model), gpus=2, gpu_mem_gib=1, prompt_tokens=10)
    learner = plan.roles[0]
    items = {i.name: i.bytes for i in learner.items}
    assert plan.seq_tokens == 16 and learner.extra["tokens_per_micro_batch"] == 32
    assert items["model states"] == 2 * SMALL_PARAMS + 9 * SMALL_PARAMS  # ZeRO-2 over 2
    assert items["activations"] == 32 * 2 * 632  # checkpointing off: every layer's activations
    assert learner.extra["activations_checkpointing"] == 32 * (2 * 2 * 16 + 632)  # layer inputs + one layer
    assert items["logits + grad"] == 2 * 2 * 32 * 100
    assert items["log-prob chunk"] == 2 * 4 * 8 * 100
    assert "diagnostics" not in items
    assert learner.total == sum(items.values()) and learner.fits


@pytest.mark.parametrize(
    ("stage", "expected"),
    [
        (1, 2 * SMALL_PARAMS),  # whole in bf16 on each of the 2 ranks: 12,704 B
        (2, 2 * SMALL_PARAMS),
        (3, 2 * SMALL_PARAMS // 2 + 2 * 2 * SMALL_LARGEST),  # half of it per rank, + 2 gathered embeddings: 12,752 B
    ],
)
def test_the_reference_model_of_ref_kl_is_counted_per_rank(small_model, stage, expected):
    off = build_plan(small_cfg(small_model, zero_stage=stage), gpus=2, gpu_mem_gib=1, prompt_tokens=10).roles[0]
    cfg = small_cfg(small_model, zero_stage=stage).model_copy(
        update={"loss": build_config({"loss": {"ref_kl": {"coef": 0.1}}}).loss}
    )
    on = build_plan(cfg, gpus=2, gpu_mem_gib=1, prompt_tokens=10).roles[0]
    items = {i.name: i.bytes for i in on.items}
    assert "reference model" not in {i.name for i in off.items}  # off by default
    assert items["reference model"] == expected and on.total == off.total + expected


def _saved_bytes_per_extra_layer_token(dtype: str, checkpointing: bool) -> float:
    """Measured: the bytes of the distinct non-parameter tensors autograd saves in a forward, per
    token, per extra decoder layer (3 layers minus 1, so embedding, final norm and logits cancel)."""
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config

    def saved_bytes(layers: int) -> int:
        cfg = Qwen2Config(
            vocab_size=100,
            hidden_size=64,
            num_hidden_layers=layers,
            num_attention_heads=4,
            num_key_value_heads=2,
            intermediate_size=128,
            max_position_embeddings=128,
            use_cache=False,
        )
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(cfg, dtype=getattr(torch, dtype), attn_implementation="sdpa")
        if checkpointing:  # transformers 5 renamed it
            (getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable)()
        params = {p.untyped_storage().data_ptr() for p in model.parameters()}
        storages = {}

        def pack(t):
            if t.untyped_storage().data_ptr() not in params:
                storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            logits = model(input_ids=torch.randint(0, 100, (2, 32))).logits
        logits.sum().backward()
        return sum(storages.values())

    return (saved_bytes(3) - saved_bytes(1)) / 2 / 64  # 2 extra layers, 2 x 32 tokens


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_layer_activations_equal_what_autograd_saves(dtype):
    from transformers import Qwen2Config

    from stare.plan.sizes import layer_activation_bytes, shape_from_hf_config

    shape = shape_from_hf_config(
        Qwen2Config(
            vocab_size=100,
            hidden_size=64,
            num_hidden_layers=1,
            num_attention_heads=4,
            num_key_value_heads=2,
            intermediate_size=128,
        ),
        "test",
    )
    measured = _saved_bytes_per_extra_layer_token(dtype, checkpointing=False)
    assert measured == layer_activation_bytes(shape, 2 if dtype == "bfloat16" else 4)


def test_with_gradient_checkpointing_a_layer_keeps_only_its_input():
    # the plan: layers x b h per token (+ one layer's activations while it is recomputed in backward)
    assert _saved_bytes_per_extra_layer_token("bfloat16", checkpointing=True) == 2 * 64


def test_token_budget_sets_the_micro_batch_tokens(small_model):
    plan = build_plan(small_cfg(small_model, max_tokens_per_micro_batch=24), gpus=1, gpu_mem_gib=1, prompt_tokens=10)
    assert plan.roles[0].extra["tokens_per_micro_batch"] == 24


def test_vllm_kv_cache_by_hand(small_model):
    # KV per token: 2 (k, v) x 2 layers x 2 kv heads x 4 head_dim x 2 bytes = 64 B; a sequence 16 tokens.
    mem = 1 * GIB
    cfg = build_config(
        {
            **small_cfg(small_model).model_dump(mode="json"),
            "rollout": {
                "prompts_per_step": 2,
                "samples_per_prompt": 2,
                "max_new_tokens": 6,
                "engine": {"name": "vllm", "gpu_memory_utilization": 0.5, "max_num_seqs": 4},
            },
            "system": {"weight_sync_communicator": "gloo"},
        }
    )  # no receive buffers on the GPU
    plan = build_plan(cfg, gpus=1, gpu_mem_gib=1, prompt_tokens=10, roles=("rollout",))
    rollout = plan.roles[0]
    assert rollout.extra["weight_receive_bytes"] == 0
    reserve = 4 * 4 * 100 + 8192 * 2 * (4 * 16 + 2 * 32)
    kv = mem // 2 - 2 * SMALL_PARAMS - reserve
    assert rollout.extra["kv_bytes_per_token"] == 64
    assert rollout.extra["kv_cache_bytes"] == kv
    assert rollout.extra["sequences_fit"] == kv // (64 * 16)
    assert rollout.fits


def test_vllm_that_cannot_hold_one_sequence_names_gpu_memory_utilization():
    cfg = load_config(PAPER_7B)
    shape = load_model_shape(cfg, MODELS / "qwen2.5-math-7b.json")
    assert cfg.rollout.engine.gpu_memory_utilization == 0.5
    plan = build_plan(cfg, gpus=8, gpu_mem_gib=24, shape=shape, prompt_tokens=1024, roles=("rollout",))
    (rollout,) = plan.roles
    assert not rollout.fits and rollout.extra["sequences_fit"] == 0
    fix = rollout.fixes[0]
    assert fix.field == "rollout.engine.gpu_memory_utilization" and fix.relation == ">=" and 0.5 < float(fix.value) <= 1


def test_nccl_weight_receive_buffers_are_two_model_copies_beside_vllms_share():
    # 7,615,616,512 bf16 parameters: 2 x 2 B x P = 30.46 GB of receive buffers outside vLLM's share.
    cfg = load_config(PAPER_7B)
    shape = load_model_shape(cfg, MODELS / "qwen2.5-math-7b.json")
    recv = 2 * 2 * 7_615_616_512
    roomy = build_plan(cfg, gpus=8, gpu_mem_gib=80, shape=shape, prompt_tokens=1024, roles=("rollout",)).roles[0]
    assert roomy.extra["weight_receive_bytes"] == recv and roomy.fits  # 0.5 x 80 GiB + 28.4 GiB + 1 GiB <= 80 GiB
    cramped = build_plan(
        cfg.model_copy(
            update={
                "rollout": cfg.rollout.model_copy(
                    update={"engine": cfg.rollout.engine.model_copy(update={"gpu_memory_utilization": 0.8})}
                )
            }
        ),
        gpus=8,
        gpu_mem_gib=80,
        shape=shape,
        prompt_tokens=1024,
        roles=("rollout",),
    ).roles[0]
    assert not cramped.fits and cramped.extra["sequences_fit"] >= 1  # vLLM alone would fit: the buffers do not
    util, gloo = cramped.fixes
    assert util.relation == "<=" and float(util.value) == int(100 * (79 * GIB - recv) / (80 * GIB)) / 100  # 0.63
    assert str(gloo).startswith("system.weight_sync_communicator=gloo")
    over_gloo = cfg.model_copy(update={"system": cfg.system.model_copy(update={"weight_sync_communicator": "gloo"})})
    assert (
        build_plan(over_gloo, gpus=8, gpu_mem_gib=80, shape=shape, prompt_tokens=1024, roles=("rollout",))
        .roles[0]
        .extra["weight_receive_bytes"]
        == 0
    )


def test_with_in_flight_updates_a_rollout_gpu_holds_one_receive_buffer_set_and_vllm_fits_at_0_8():
    # one set: 2 B x 7,615,616,512 = 15.23 GB; 0.8 x 80 GiB + 14.19 GiB + 1 GiB = 79.2 GiB > 79.0 usable with two,
    # 64.0 + 14.19 + 1 = 79.19 <= 79.2: the same share fits beside one set (stare plan prints 78.2 GiB)
    cfg = load_config(
        PAPER_7B,
        overrides=[
            "system.max_staleness=1",
            "system.inflight_weight_updates=true",
            "rollout.engine.gpu_memory_utilization=0.8",
        ],
    )
    shape = load_model_shape(cfg, MODELS / "qwen2.5-math-7b.json")
    rollout = build_plan(cfg, gpus=8, gpu_mem_gib=80, shape=shape, prompt_tokens=1024, roles=("rollout",)).roles[0]
    assert rollout.extra["weight_receive_bytes"] == 2 * 7_615_616_512 and rollout.fits
    two = load_config(PAPER_7B, overrides=["rollout.engine.gpu_memory_utilization=0.8"])
    assert (
        not build_plan(two, gpus=8, gpu_mem_gib=80, shape=shape, prompt_tokens=1024, roles=("rollout",)).roles[0].fits
    )


def test_paper_7b_recipe_fits_8_x_80gb_at_zero3():
    cfg = load_config(PAPER_7B)
    assert cfg.optim.zero_stage == 3
    shape = load_model_shape(cfg, MODELS / "qwen2.5-math-7b.json")
    plan = build_plan(cfg, gpus=8, gpu_mem_gib=80, shape=shape, prompt_tokens=1024)
    learner = plan.roles[0]
    assert plan.seq_tokens == 4096 and learner.extra["tokens_per_micro_batch"] == 8192
    assert learner.fits and plan.fits and learner.fixes == []


def test_paper_7b_recipe_does_not_fit_one_24gb_gpu_and_says_why():
    cfg = load_config(PAPER_7B)
    shape = load_model_shape(cfg, MODELS / "qwen2.5-math-7b.json")
    learner = build_plan(cfg, gpus=1, gpu_mem_gib=24, shape=shape, prompt_tokens=1024).roles[0]
    assert not learner.fits
    states = next(i.bytes for i in learner.items if i.name == "model states")
    assert states > HEADROOM * 24 * GIB  # the weights, gradients and Adam state alone are too big
    # the weight snapshot published from rank 0's GPU (14.2 GiB, not sharded) first goes to host memory
    host, fix = learner.fixes
    assert (host.field, host.value) == ("system.weight_sync_publish_from", "host")
    assert fix.field == "learner GPUs" and fix.relation == ">=" and "optim.zero_stage=3" in fix.why
    # the number named is the fewest GPUs that hold it with one sequence per micro-batch
    narrow = load_config(
        PAPER_7B,
        overrides=[
            "optim.max_tokens_per_micro_batch=4096",
            "diagnostics.predicted_entropy_change=false",
            "system.weight_sync_publish_from=host",
        ],
    )
    assert build_plan(narrow, gpus=fix.value, gpu_mem_gib=24, shape=shape, prompt_tokens=1024).roles[0].fits
    assert not build_plan(narrow, gpus=fix.value - 1, gpu_mem_gib=24, shape=shape, prompt_tokens=1024).roles[0].fits


def test_gradient_checkpointing_is_the_named_fix_when_it_suffices():
    # rows, not the shipped token budget: 4 x 4,096 tokens a micro-batch
    cfg = load_config(
        REPO / "configs" / "gpu-node.yaml",
        overrides=["optim.gradient_checkpointing=false", "optim.max_tokens_per_micro_batch=null"],
    )
    shape = load_model_shape(cfg, MODELS / "qwen2.5-math-1.5b.json")
    learner = build_plan(cfg, gpus=1, gpu_mem_gib=80, shape=shape, prompt_tokens=1024).roles[0]
    assert not learner.fits and [f.override for f in learner.fixes] == ["optim.gradient_checkpointing=true"]


def test_too_many_tokens_per_micro_batch_names_the_budget():
    rows = ["optim.max_tokens_per_micro_batch=null", "optim.micro_batch=64"]  # 64 rows, no token budget
    cfg = load_config(REPO / "configs" / "gpu-node.yaml", overrides=rows)
    shape = load_model_shape(cfg, MODELS / "qwen2.5-math-1.5b.json")
    learner = build_plan(cfg, gpus=1, gpu_mem_gib=80, shape=shape, prompt_tokens=1024).roles[0]
    assert not learner.fits
    overrides = [f.override for f in learner.fixes]
    assert None not in overrides and overrides[-1].startswith("optim.max_tokens_per_micro_batch=")
    tokens = int(overrides[-1].split("=")[1])
    fixed = load_config(REPO / "configs" / "gpu-node.yaml", overrides=[*rows, *overrides])
    assert build_plan(fixed, gpus=1, gpu_mem_gib=80, shape=shape, prompt_tokens=1024).roles[0].fits
    over = load_config(
        REPO / "configs" / "gpu-node.yaml",
        overrides=[*rows, *overrides, f"optim.max_tokens_per_micro_batch={tokens + 1}"],
    )
    assert not build_plan(over, gpus=1, gpu_mem_gib=80, shape=shape, prompt_tokens=1024).roles[0].fits


def test_shipped_gpu_node_config_fits_the_80gb_gpus_its_comment_names():
    path = REPO / "configs" / "gpu-node.yaml"
    assert "80 GB" in path.read_text().split("algo:")[0]
    cfg = load_config(path)
    plan = build_plan(cfg, gpus=1, gpu_mem_gib=80, shape=load_model_shape(cfg, MODELS / "qwen2.5-math-1.5b.json"))
    assert plan.fits


def test_cli_plan_exit_status_and_json(capsys):
    from stare.app.cli import main

    args = [
        "plan",
        "--config",
        str(PAPER_7B),
        "--model-config",
        str(MODELS / "qwen2.5-math-7b.json"),
        "--prompt-tokens",
        "1024",
    ]
    assert main([*args, "--gpus", "8", "--gpu-mem-gib", "80", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)  # stdout is the JSON alone
    assert out["fits"] and out["roles"][0]["role"] == "learner" and out["model"]["params"] == 7_615_616_512
    # one learner GPU (colocation off): the learner alone does not fit and is told how many it needs
    assert main([*args, "--gpus", "1", "--gpu-mem-gib", "24", "--set", "system.colocate=off"]) == 1
    text = capsys.readouterr().out
    assert "DOES NOT FIT" in text and "change: learner GPUs >= " in text
    # --gpus 1 is the colocated one-GPU plan (stare train): told to train adapters, not to add GPUs
    assert main([*args, "--gpus", "1", "--gpu-mem-gib", "24"]) == 1
    text = capsys.readouterr().out
    assert "DOES NOT FIT" in text and "change: model.lora" in text and "change: learner GPUs >= " not in text


def test_cli_plan_names_a_missing_model_config(tmp_path, capsys):
    from stare.app.cli import main

    assert main(["plan", "--model-config", str(tmp_path / "nope.json")]) == 2
    assert "--model-config" in capsys.readouterr().err


def test_check_fits_skips_without_cuda(small_model):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this test is about a machine without CUDA")
    lines = []
    assert check_fits(small_cfg(small_model), small_model, log=lines.append) is None
    assert lines and "no CUDA device, skipped" in lines[0]


def test_check_fits_refuses_with_the_field_on_a_small_gpu(small_model, monkeypatch):
    """The refusal itself, with the device's memory made small: torch.cuda reports a 'GPU'."""
    import torch

    class Props:
        # 128 KiB, 115.2 usable: the small model's states (ZeRO-2, 1 GPU) take 124 KiB. With gradient
        # checkpointing, one 64-token sequence needs 38,912 + 25,600 + 9,600 B beside ZeRO-3's 6,400 +
        # 114,336 / N B of states: N = 4 is the fewest GPUs that fit.
        total_memory = 128 * 1024

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda _: Props)
    with pytest.raises(ConfigError, match=r"learner needs .*change: learner GPUs >= 4 .*model\.path"):
        check_fits(small_cfg(small_model), small_model, log=lambda _: None)


def test_the_docs_show_the_current_plan_of_the_7b_recipe():
    import dataclasses

    from stare.plan.render import render

    cfg = load_config(PAPER_7B)
    shape = load_model_shape(cfg, MODELS / "qwen2.5-math-7b.json")
    shape = dataclasses.replace(shape, source="configs/models/qwen2.5-math-7b.json")  # as the docs' command says
    plan = build_plan(cfg, gpus=8, gpu_mem_gib=80, shape=shape, prompt_tokens=1024)
    text = render(plan)
    assert text in (REPO / "docs" / "deploy.md").read_text(), "regenerate the stare plan output in docs/deploy.md"
    learner = text[text.index("learner (") : text.index("\n\nrollout")]
    assert learner in (REPO / "docs" / "distributed.md").read_text()


@pytest.mark.parametrize(
    "where, staleness, snapshot, send",
    [
        # 7,615,616,512 bf16 params; the largest layer (the head) 544,997,376; buckets 2 x 256 MiB
        ("device", 0, 2 * 7_615_616_512, 2 * 256 * 2**20),  # ZeRO-3: the gathered model on rank 0's GPU
        ("device", 1, 2 * 2 * 7_615_616_512, 2 * 256 * 2**20),  # in the background: the one sent and the next
        ("host", 0, 0, 2 * 256 * 2**20 + 2 * 2 * 544_997_376),  # pinned host copies; 2 large tensors to the GPU
    ],
)
def test_the_published_weights_are_counted_where_they_live(where, staleness, snapshot, send):
    cfg = load_config(
        PAPER_7B, overrides=[f"system.weight_sync_publish_from={where}", f"system.max_staleness={staleness}"]
    )
    shape = load_model_shape(cfg, MODELS / "qwen2.5-math-7b.json")
    items = {
        i.name: i.bytes for i in build_plan(cfg, gpus=8, gpu_mem_gib=80, shape=shape, prompt_tokens=1024).roles[0].items
    }
    assert items.get("weight snapshot", 0) == snapshot and items["weight send"] == send


def test_the_plan_prints_the_checkpoint_disk_cost_of_the_7b_recipe():
    cfg = load_config(PAPER_7B)  # every 50 steps, 2 kept, 5,500 steps, ZeRO-3
    shape = load_model_shape(cfg, MODELS / "qwen2.5-math-7b.json")
    c = build_plan(cfg, gpus=8, gpu_mem_gib=80, shape=shape, prompt_tokens=1024).checkpoint
    each = 12 * 7_615_616_512  # fp32 master + two Adam moments: 91.4 GB
    assert c == {"bytes": each, "every": 50, "keep": 2, "peak_bytes": 3 * each, "written_bytes": 110 * each}
    assert c["peak_bytes"] <= 300e9  # the budget docs/recipes.md states


def test_lora_counts_optimizer_state_for_the_adapters_only_and_fits_1_5b_on_one_24gb_gpu():
    # Qwen2.5-Math-1.5B: h 1536, kv 256, i 8960, 28 layers; r 16 on the seven projections:
    # per layer 16 x ((h+h) + 2 (h+kv) + (h+h) + 2 (h+i) + (i+h)) = 16 x 41,216
    cfg = load_config((REPO / "configs" / "gpu-node.yaml"), overrides=["model.lora.r=16"])
    shape = load_model_shape(cfg, MODELS / "qwen2.5-math-1.5b.json")
    adapters = 28 * 16 * (2 * 1536 + 2 * (1536 + 256) + 2 * 1536 + 2 * (1536 + 8960) + (8960 + 1536))
    assert adapters == 18_464_768
    learner = build_plan(cfg, gpus=1, gpu_mem_gib=24, shape=shape, prompt_tokens=1024).roles[0]
    states = next(i.bytes for i in learner.items if i.name == "model states")
    assert states == 2 * shape.params + 16 * adapters  # frozen bf16 base + the adapters' weights, grads, Adam
    assert learner.fits
    full = build_plan(
        load_config(REPO / "configs" / "gpu-node.yaml"), gpus=1, gpu_mem_gib=24, shape=shape, prompt_tokens=1024
    ).roles[0]
    assert not full.fits  # the test can tell: full training of 1.5B does not fit one 24 GB GPU
