import runpy
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
ROOT = Path(__file__).parents[2]


def test_entropy_probe_trains_each_arm_from_the_same_start(fast_overrides, capsys):
    probe = runpy.run_path(str(ROOT / "scripts" / "entropy_probe.py"))
    argv = [
        "--config",
        str(ROOT / "configs" / "tiny-cpu.yaml"),
        "--updates",
        "1",
        "--arm",
        "grpo:algo=grpo",
        "--arm",
        "o1:loss.variant=O1,controller.band=null,controller.target=5.0,controller.w=3.0,controller.w_max=3.0",
    ]
    for o in fast_overrides:
        if not o.startswith(("run.output_dir=", "run.name=")):
            argv += ["--set", o]
    probe["main"](argv)
    lines = [line for line in capsys.readouterr().out.splitlines() if "entropy after" in line]
    assert [line.split()[0] for line in lines] == ["grpo", "o1"]
    assert "gate 0" in lines[0] and "gate 1" in lines[1] and "W used 3.00" in lines[1]
