"""`stare plan --gpus 1` (stare/plan/colocation.py): the learner and the engine of `stare train` on one
GPU, the engine asleep while the learner steps; figures derived by hand for Qwen2.5-Math-1.5B."""

from __future__ import annotations

from pathlib import Path

import pytest

from stare.config import ConfigError, load_config
from stare.plan.colocation import SLEEP_RESIDUAL, build_one_gpu_plan
from stare.plan.gpu_memory import GIB, HEADROOM
from stare.plan.sizes import load_model_shape

REPO = Path(__file__).parents[2]
MODEL = REPO / "configs" / "models" / "qwen2.5-math-1.5b.json"
ONE_GPU = REPO / "configs" / "one-gpu.yaml"
P = 1_543_714_304  # Qwen2.5-Math-1.5B's parameters (tied embeddings once), as tests/core/test_plan.py counts them


def _plan(gpu_gib: float, *overrides: str):
    cfg = load_config(ONE_GPU, overrides=list(overrides))
    return build_one_gpu_plan(cfg, gpu_mem_gib=gpu_gib, shape=load_model_shape(cfg, MODEL))


def _items(role) -> dict[str, int]:
    return {i.name: i.bytes for i in role.items}


def test_the_shipped_one_gpu_config_fits_a_24gb_gpu_with_lora_and_no_offload():
    plan = _plan(24)
    step, sampling = plan.roles
    assert plan.fits and step.fits and sampling.fits and not sampling.extra["offload"]
    assert _items(step)["engine asleep"] == SLEEP_RESIDUAL  # vLLM asleep, beside the learner's step
    assert not {"weight send", "weight snapshot"} & set(_items(step))  # stare train: weights through host memory
    share = int(0.7 * 24 * GIB)  # gpu_memory_utilization 0.7 of 24 GiB: vLLM's whole share, awake
    items = _items(sampling)
    assert items["engine weights"] + items["forward reserve"] + items["KV cache"] == share
    assert items["engine weights"] == 2 * P  # bf16
    assert sampling.total == items["learner resident"] + share <= HEADROOM * 24 * GIB
    assert any("sleeps while the learner steps" in h for h in plan.how)


def test_auto_offloads_the_optimizer_only_when_the_awake_engine_needs_it():
    # full training, ZeRO-1 on one GPU: 4P (bf16 weights and grads) + 16P (fp32 master, Adam) = 20P
    full = ("model.lora=null",)
    tight = _plan(80, *full, "rollout.engine.gpu_memory_utilization=0.6").roles[1]
    # 20P + 0.6 x 80 GiB = 82.4 GB > 0.9 x 80 GiB = 77.3 GB; with the optimizer offloaded 2P + 51.5 GB fits
    assert tight.extra["offload"] and tight.fits
    assert _items(tight)["learner resident"] == 2 * P and tight.extra["learner_states_bytes"] == 20 * P
    assert tight.total == 2 * P + int(0.6 * 80 * GIB)
    roomy = _plan(80, *full, "rollout.engine.gpu_memory_utilization=0.4").roles[1]
    assert not roomy.extra["offload"] and roomy.fits  # 20P + 34.4 GB = 65.2 GB fits: nothing moves
    assert _items(roomy)["learner resident"] == 20 * P


def test_colocate_offload_none_is_kept_and_the_fix_names_it():
    sampling = _plan(
        80, "model.lora=null", "rollout.engine.gpu_memory_utilization=0.6", "system.colocate_offload=none"
    ).roles[1]
    assert not sampling.fits and not sampling.extra["offload"]
    assert "system.colocate_offload=optimizer" in [f.override for f in sampling.fixes]


def test_a_vllm_share_too_large_for_the_learner_names_the_utilization_that_fits():
    sampling = _plan(24, "rollout.engine.gpu_memory_utilization=0.9").roles[1]
    assert not sampling.fits
    fix = next(f for f in sampling.fixes if f.field == "rollout.engine.gpu_memory_utilization")
    assert fix.relation == "<="
    # (0.9 x 24 GiB - the resident LoRA learner) / 24 GiB, rounded down to the hundredth
    resident = _items(sampling)["learner resident"]
    assert float(fix.value) == int(100 * (HEADROOM * 24 * GIB - resident) / (24 * GIB)) / 100
    assert _plan(24, f"rollout.engine.gpu_memory_utilization={fix.value}").roles[1].fits


def test_the_hf_engine_asleep_holds_nothing_and_awake_one_calls_cache():
    plan = _plan(24, "rollout.engine=hf", "rollout.prompts_per_step=4")
    step, sampling = plan.roles
    assert _items(step)["engine asleep"] == 0
    kv_per_token = 2 * 28 * 2 * 128 * 2  # layers x kv heads x head_dim x bf16, keys and values: 28,672 B
    rows = 4 * 8  # prompts_per_step x samples_per_prompt: the embedded worker's one call
    assert _items(sampling)["engine KV cache"] == rows * 4096 * kv_per_token
    assert _items(sampling)["engine weights"] == 2 * P


def test_a_colocated_plan_is_for_one_gpu():
    with pytest.raises(ConfigError, match="one GPU"):
        build_one_gpu_plan(
            load_config(ONE_GPU), gpus=2, gpu_mem_gib=24, shape=load_model_shape(load_config(ONE_GPU), MODEL)
        )


def test_cli_plan_gpus_1_prints_the_colocated_plan_and_its_verdict(capsys):
    from stare.app.cli import main

    args = ["plan", "--config", str(ONE_GPU), "--model-config", str(MODEL), "--gpu-mem-gib", "24"]
    assert main([*args, "--gpus", "1"]) == 0
    text = capsys.readouterr().out
    for line in (
        "one GPU, colocated (stare train):",
        "learner step, the engine asleep (1 x 24 GiB GPU), per GPU:",
        "sampling, the engine awake (1 x 24 GiB GPU), per GPU:",
        "engine asleep",
        "how: ",
        "fits on one GPU, colocated",
    ):
        assert line in text, line
    assert main(args) == 0  # no --gpus: the learner and each rollout worker on GPUs of their own, as before
    assert "colocated" not in capsys.readouterr().out
    main([*args, "--gpus", "1", "--set", "system.colocate=off"])
    assert "colocated" not in capsys.readouterr().out
    assert main([*args, "--gpus", "1", "--set", "rollout.engine.gpu_memory_utilization=0.95"]) == 1
    assert "change: rollout.engine.gpu_memory_utilization <= " in capsys.readouterr().out


def test_at_zero_0_the_offload_moves_only_the_adam_moments():
    # ZeRO-0 offloads the torch optimizer's moments only (learner/engine/deepspeed_engine.py): DeepSpeed's bf16
    # wrapper keeps its fp32 master copy on the GPU. Full training, bf16: the states are
    # estimate_zero2 on one GPU, 4P + 16P = 20P; resident with the moments (2 x 4P fp32) offloaded: 12P
    sampling = _plan(80, "model.lora=null", "optim.zero_stage=0", "system.colocate_offload=optimizer").roles[1]
    assert sampling.extra["offload"] and sampling.extra["learner_states_bytes"] == 20 * P
    assert _items(sampling)["learner resident"] == 12 * P  # not the 2P of the weights alone
    # LoRA r 32, ZeRO-0: frozen base 2P + 16 B x T adapter parameters; the moments 8T move: 2P + 8T stay
    lora = _plan(24, "optim.zero_stage=0", "system.colocate_offload=optimizer").roles[1]
    t = (lora.extra["learner_states_bytes"] - 2 * P) // 16
    assert _items(lora)["learner resident"] == 2 * P + 8 * t


def test_a_learner_too_large_for_one_gpu_is_not_told_to_take_more_learner_gpus():
    # full training of the 7B model: 129.7 GiB of ZeRO-3 states cannot share one 24 GB GPU with anything;
    # the two-GPU plan's "learner GPUs >= N" is no change to a one-GPU plan: adapters, or colocation off
    cfg = load_config(REPO / "configs" / "paper" / "short-cot-qwen2.5-math-7b-stare.yaml")
    plan = build_one_gpu_plan(
        cfg, gpu_mem_gib=24, shape=load_model_shape(cfg, REPO / "configs" / "models" / "qwen2.5-math-7b.json")
    )
    step = plan.roles[0]
    assert not step.fits and "learner GPUs" not in [f.field for f in step.fixes]
    assert "model.lora" in [f.field for f in step.fixes]
    off = next(f for f in step.fixes if f.field == "system.colocate")
    assert off.override == "system.colocate=off" and ">= 10 learner GPUs" in off.why


def _node_plan(gpus: int, gpu_gib: float, *overrides: str):
    from stare.plan.colocation import build_node_plan

    # the shipped one-GPU config hands its weights over through host memory; the node default is auto (device)
    cfg = load_config(
        ONE_GPU, overrides=["model.lora=null", "system.colocate=on", "system.weight_sync_publish_from=auto", *overrides]
    )
    return build_node_plan(cfg, gpus=gpus, gpu_mem_gib=gpu_gib, shape=load_model_shape(cfg, MODEL)), cfg


def test_the_node_colocated_plan_shards_the_learner_and_counts_the_zero3_gather_beside_the_waking_engine():
    plan, cfg = _node_plan(8, 80, "optim.zero_stage=3", "rollout.engine.gpu_memory_utilization=0.5")
    step, sampling = plan.roles
    assert step.gpus == sampling.gpus == 8
    states = plan.zero_stages[3]["bytes"]  # DeepSpeed's ZeRO-3 estimate over 8 GPUs
    assert _items(step)["model states"] == states and _items(step)["engine asleep"] == SLEEP_RESIDUAL
    items = _items(sampling)
    share = int(0.5 * 80 * GIB)  # vLLM's whole share awake, as on one GPU
    assert items["engine weights"] + items["forward reserve"] + items["KV cache"] == share
    assert items["learner resident"] == states  # ZeRO-3 moves nothing aside (colocate_offload auto: none here)
    assert items["gathered weights"] == 2 * P  # every rank holds the whole bf16 model until its engine loaded it
    assert sampling.total == states + share + 2 * P and plan.fits
    rows = cfg.rollout.prompts_per_step * cfg.rollout.samples_per_prompt // 8  # each engine's share of a step
    assert f"its share of a step: {rows})" in next(i.note for i in sampling.items if i.name == "KV cache")
    assert any("8 learner ranks" in h for h in plan.how)


@pytest.mark.parametrize(
    "overrides",
    [("optim.zero_stage=3", "system.weight_sync_publish_from=host"), ("optim.zero_stage=1",)],
    ids=["zero3-through-host", "zero1-parameters"],
)
def test_no_gathered_copy_through_host_memory_or_below_zero3(overrides):
    plan, _ = _node_plan(8, 80, *overrides)
    assert "gathered weights" not in _items(plan.roles[1])


def test_a_node_plan_that_does_not_fit_names_the_host_hand_over_first():
    plan, _ = _node_plan(8, 24, "optim.zero_stage=3", "rollout.engine.gpu_memory_utilization=0.8")
    sampling = plan.roles[1]
    assert not sampling.fits and sampling.fixes[0].field == "system.weight_sync_publish_from"
    util = next(f for f in sampling.fixes if f.field == "rollout.engine.gpu_memory_utilization")
    # the share that fits leaves room for the gathered copy outside it: resident + share + 2P <= 90%
    assert _items(sampling)["learner resident"] + float(util.value) * 24 * GIB + 2 * P <= HEADROOM * 24 * GIB


def test_cli_plan_gpus_8_with_colocate_on_prints_the_node_plan(capsys):
    from stare.app.cli import main

    code = main(
        [
            "plan",
            "--config",
            str(ONE_GPU),
            "--model-config",
            str(MODEL),
            "--gpus",
            "8",
            "--gpu-mem-gib",
            "80",
            "--set",
            "model.lora=null",
            "--set",
            "optim.zero_stage=3",
            "--set",
            "system.colocate=on",
            "--set",
            "system.weight_sync_publish_from=auto",
        ]
    )
    out = capsys.readouterr().out
    assert "8 GPUs, each a learner rank hosting a rollout engine" in out and "gathered weights" in out
    assert code == 0 and out.rstrip().endswith("fits on each of 8 GPUs, colocated")
