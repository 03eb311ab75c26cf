"""`stare up` gives each role its own GPUs: `--print-plan` on an 8-GPU node (`--gpus 8` here, a
CPU machine) prints disjoint CUDA_VISIBLE_DEVICES per role, learner first, one rollout worker per
tensor_parallel_size GPUs; bad GPU flags fail naming the flag."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from stare.config import ConfigError
from stare.plan.gpu_map import parse_gpus, plan_gpus


def _print_plan(*args: str) -> dict[str, str]:
    out = subprocess.run(
        [sys.executable, "-m", "stare.app.cli", "up", "--print-plan", "--set", "rollout.engine.name=vllm", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    roles = re.findall(r"^(\S+):\n  command: (.+)\n  env: (.*)\n", out.stdout, flags=re.M)
    for name, command, _ in roles:
        assert command.split()[3] == name.split("-")[0] and "stare.app.cli" in command
    return {name: (re.search(r"CUDA_VISIBLE_DEVICES=(\S*)", env) or [None, None])[1] for name, _, env in roles}


def _ids(devices: str) -> set[int]:
    return {int(g) for g in devices.strip("'").split(",") if g}


@pytest.mark.parametrize("tp, workers", [(1, 7), (2, 3)])
def test_an_8_gpu_node_gets_disjoint_gpus_per_role(tp, workers):
    devices = _print_plan("--gpus", "8", "--set", f"rollout.engine.tensor_parallel_size={tp}")
    assert _ids(devices["learner"]) == {0}
    rollout = [_ids(devices[f"rollout-{i}"]) for i in range(workers)]
    assert f"rollout-{workers}" not in devices
    assert all(len(g) == tp for g in rollout)
    every = [_ids(devices["learner"])] + rollout
    assert sum(map(len, every)) == len(set().union(*every)), f"a GPU is given twice: {devices}"
    assert set().union(*every) <= set(range(8))
    assert _ids(devices["reward-0"]) == set() and _ids(devices["control"]) == set()


def test_flags_choose_the_sets():
    devices = _print_plan("--gpus", "8", "--learner-gpus", "0,1", "--rollout-gpus", "4-7", "--rollout", "2")
    assert _ids(devices["learner"]) == {0, 1}
    assert [_ids(devices["rollout-0"]), _ids(devices["rollout-1"])] == [{4}, {5}]


def test_a_one_gpu_node_shares_it_between_learner_and_rollout():
    plan = plan_gpus(1)
    assert (plan.learner, plan.rollout, plan.shared) == ([0], [[0]], True)


def test_without_gpus_nothing_is_pinned():
    devices = _print_plan("--gpus", "0")
    assert devices["learner"] is None and devices["rollout-0"] is None


@pytest.mark.parametrize(
    "kwargs, flag",
    [
        ({"learner_gpus": "0", "rollout_gpus": "0-3"}, "share GPU"),
        ({"rollout_gpus": "8"}, "--rollout-gpus: GPU 8 does not exist"),
        ({"learner_gpus": "x"}, "--learner-gpus 'x'"),
        ({"rollout": 8}, "--rollout 8"),
        ({"tensor_parallel_size": 8}, "tensor_parallel_size=8"),
    ],
)
def test_bad_gpu_flags_name_the_flag(kwargs, flag):
    with pytest.raises(ConfigError, match=re.escape(flag)):
        plan_gpus(8, **kwargs)


def test_parse_gpus():
    assert parse_gpus("0,2-4, 7", "--x") == [0, 2, 3, 4, 7]


def test_a_node_colocated_learner_takes_every_gpu_and_no_rollout_worker_runs():
    devices = _print_plan("--gpus", "8", "--set", "system.colocate=on")
    assert _ids(devices["learner"]) == set(range(8))  # 8 ranks (system.learner_ranks from the GPU count)
    assert not [name for name in devices if name.startswith("rollout")]
    assert _ids(devices["reward-0"]) == set() and _ids(devices["control"]) == set()
    fewer = _print_plan("--gpus", "8", "--learner-ranks", "4", "--set", "system.colocate=on")
    assert _ids(fewer["learner"]) == {0, 1, 2, 3}


@pytest.mark.parametrize("kwargs", [{"rollout_gpus": "4-7"}, {"rollout": 2}])
def test_rollout_flags_are_refused_when_the_learner_ranks_sample(kwargs):
    with pytest.raises(ConfigError, match="system.colocate is on"):
        plan_gpus(8, learner_ranks=8, colocated=True, **kwargs)
