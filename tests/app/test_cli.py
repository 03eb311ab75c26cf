import subprocess
import sys

import pytest

from stare.app.cli import main


def test_help_lists_the_commands_without_heavy_imports():
    out = subprocess.run([sys.executable, "-m", "stare.app.cli", "--help"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "train" in out.stdout and "compare" in out.stdout
    probe = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, stare.app.cli; stare.app.cli.build_parser(); print('torch' in sys.modules)",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert probe.stdout.strip() == "False"  # no heavy import before a subcommand runs


def test_bad_config_value_exits_2_naming_the_field(capsys):
    assert main(["train", "--set", "optim.lr=-3"]) == 2
    assert "optim.lr" in capsys.readouterr().err


def test_unknown_algo_exits_2_listing_valid_ones(capsys):
    assert main(["train", "--algo", "ppo"]) == 2
    assert "grpo" in capsys.readouterr().err


@pytest.mark.slow
def test_compare_trains_each_algo_and_writes_figure_and_table(fast_overrides, tmp_path):
    args = ["compare", "--algos", "stare,grpo", "--seeds", "0", "--out", str(tmp_path / "cmp")]
    for o in fast_overrides + ["run.steps=1"]:
        args += ["--set", o]
    assert main(args) == 0
    table = (tmp_path / "cmp" / "compare.md").read_text()
    assert "stare" in table and "grpo" in table
    assert (tmp_path / "cmp" / "compare.png").stat().st_size > 10_000
    # each run named once from the config's name (run.name=t), its last evaluation with 64 samples for pass@64
    runs = sorted(p.name for p in (tmp_path / "runs").iterdir())
    assert runs == ["t-grpo-s0", "t-stare-s0"]
    last = (tmp_path / "runs" / "t-grpo-s0" / "eval.jsonl").read_text().splitlines()[-1]
    assert '"k": 64' in last


def test_stare_up_without_a_rollout_worker_fails_naming_the_flag(capsys):
    from stare.app.cli import main

    assert main(["up", "--rollout", "0"]) == 2
    assert "--rollout (0)" in capsys.readouterr().err


def test_stare_launch_ray_with_bad_counts_fails_naming_the_flag(capsys):
    from stare.app.cli import main

    assert main(["launch", "--ray", "--rollout", "0"]) == 2
    assert "--rollout (0)" in capsys.readouterr().err
    assert main(["launch", "--ray", "--max-restarts", "-1"]) == 2
    assert "--max-restarts (-1)" in capsys.readouterr().err


def test_build_model_and_sandbox_get_their_whole_argument_list_including_leading_options():
    from stare.app.cli import parse_args

    assert parse_args(["build-model", "--quiet", "--out", "/x"]).rest == ["--quiet", "--out", "/x"]
    assert parse_args(["build-model", "--help"]).rest == ["--help"]
    assert parse_args(["sandbox", "run", "--cpu-s", "1", "f.py"]).rest == ["run", "--cpu-s", "1", "f.py"]


def test_an_unknown_option_of_another_subcommand_is_still_an_error(capsys):
    from stare.app.cli import parse_args

    with pytest.raises(SystemExit) as err:
        parse_args(["train", "--bogus"])
    assert err.value.code == 2 and "unrecognized arguments: --bogus" in capsys.readouterr().err


def test_the_algo_help_lists_every_preset():
    import argparse

    from stare.app.cli import _config_args
    from stare.config import ALGO_PRESETS

    parser = argparse.ArgumentParser()
    _config_args(parser)
    help_text = next(a.help for a in parser._actions if "--algo" in a.option_strings)
    assert help_text.split(": ", 1)[1].split(", ") == list(ALGO_PRESETS)
