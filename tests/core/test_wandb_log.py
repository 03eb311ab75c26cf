"""Weights & Biases logging in offline mode (no network; WANDB_DIR in tmp): the run file holds
every metrics.jsonl field at its step and the held-out results under eval/; the report's figures
and summary are added to the same W&B run; a resumed run continues that run; without
logging.wandb nothing is written; a missing wandb package is a ConfigError naming the field."""

from __future__ import annotations

import json
import sys

import pytest
import wandb_helpers

from stare.config import ConfigError, build_config
from stare.observe.run_outputs import RunOutputs
from stare.observe.wandb_log import ID_FILE, flatten

STEPS = [
    {
        "step": 1,
        "algo": "stare",
        "entropy": 0.5,
        "target": 0.3,
        "gate": True,
        "w": 1.25,
        "reward_mean": 0.25,
        "staleness_hist": {"0": 6, "1": 2},
        "staleness_mean": None,
        "control_audit_ids": [3],
        "time_step_s": 0.7,
    },
    {
        "step": 2,
        "algo": "stare",
        "entropy": 0.375,
        "target": 0.3,
        "gate": False,
        "w": 1.0,
        "reward_mean": 0.5,
        "staleness_hist": {"0": 8},
        "staleness_mean": 0.0,
        "control_audit_ids": [],
        "time_step_s": 0.6,
    },
]
EVAL = {"step": 2, "greedy_accuracy": 0.625, "pass_at_k": 0.75, "avg_at_k": 0.5, "k": 4, "n": 16}


def config(tmp_path, **wandb):
    return build_config(
        {
            "run": {"name": "wb", "output_dir": str(tmp_path / "runs")},
            "logging": {"wandb": {"project": "stare-tests", "mode": "offline", **wandb}},
        }
    )


@pytest.fixture
def offline(tmp_path, monkeypatch):
    wandb_dir = tmp_path / "wandb-dir"
    wandb_dir.mkdir()
    for key, value in {
        "WANDB_MODE": "offline",
        "WANDB_DIR": str(wandb_dir),
        "WANDB_SILENT": "true",
        "WANDB_DISABLE_GIT": "true",
        "WANDB_API_KEY": "",
    }.items():
        monkeypatch.setenv(key, value)
    return wandb_dir


@pytest.fixture
def logged_run(tmp_path, offline):
    cfg = config(tmp_path)
    outputs = RunOutputs(cfg, resume_step=None)
    for metrics in STEPS:
        outputs.log_step(dict(metrics))
    outputs.log_eval(dict(EVAL))
    outputs.close()
    return cfg, offline


def test_flatten_nests_with_slashes_and_leaves_out_unmeasured_values():
    assert flatten({"a": {"b": 1, "c": {"d": 2}}, "e": None, "f": [1]}) == {"a/b": 1, "a/c/d": 2, "f": [1]}


def test_offline_run_file_holds_every_metrics_field_and_the_eval(logged_run):
    cfg, wandb_dir = logged_run
    (run_file,) = wandb_helpers.run_files(wandb_dir)
    rows = wandb_helpers.history(run_file)
    assert sorted(rows) == [1, 2]
    written = [json.loads(line) for line in (cfg.run_dir / "metrics.jsonl").read_text().splitlines()]
    for line in written:
        assert flatten(line).items() <= rows[line["step"]].items(), line["step"]
    assert rows[1]["staleness_hist/0"] == 6 and "staleness_mean" not in rows[1]
    assert {f"eval/{k}": v for k, v in EVAL.items() if k != "step"}.items() <= rows[2].items()
    assert run_file.stem == f"run-{(cfg.run_dir / ID_FILE).read_text().strip()}"


def test_the_report_is_added_to_the_same_wandb_run(logged_run):
    from matplotlib.figure import Figure

    from stare.observe.wandb_log import log_report

    cfg, wandb_dir = logged_run
    report = cfg.run_dir / "report"
    report.mkdir()
    for name in ("entropy", "reward"):
        fig = Figure(figsize=(2, 2))
        fig.add_subplot().plot([1, 2], [2, 1])
        fig.savefig(report / f"{name}.png")
    (report / "summary.md").write_text("# summary\n")
    log_report(cfg, report)
    first, second = wandb_helpers.run_files(wandb_dir)
    assert first.name == second.name  # one W&B run id, continued
    rows = wandb_helpers.history(second)
    assert sorted(rows) == [2]  # at the run's last step
    assert rows[2]["report/entropy/_type"] == rows[2]["report/reward/_type"] == "image-file"
    files = second.parent / "files"  # complete: history() waited for the exit record
    assert (files / "report" / "summary.md").read_text() == "# summary\n"
    assert len(list(files.glob("media/images/report/*.png"))) == 2


def test_a_resumed_run_continues_the_wandb_run(logged_run):
    cfg, wandb_dir = logged_run
    outputs = RunOutputs(cfg, resume_step=1)
    outputs.log_step({**STEPS[1], "step": 3})
    outputs.close()
    first, resumed = wandb_helpers.run_files(wandb_dir)
    assert first.name == resumed.name
    assert sorted(wandb_helpers.history(resumed)) == [3]


GENERATIONS = [
    {"data_source": "aime24", "problem_id": "aime24-3", "prompt": "2+2=", "ground_truth": "4", "response": "#4",
     "score": 1.0, "sampled_response": "#5", "sampled_score": 0.0},
    {"data_source": "math", "problem_id": "math-7", "prompt": "3*3=", "ground_truth": "9", "response": "#6",
     "score": 0.0, "sampled_response": None, "sampled_score": None},
]  # fmt: skip


def test_an_evaluations_generations_go_to_the_file_tensorboard_and_a_wandb_table(tmp_path, offline):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    cfg = config(tmp_path)
    outputs = RunOutputs(cfg, resume_step=None)
    outputs.log_eval({**EVAL, "generations": [dict(g) for g in GENERATIONS]})
    outputs.close()
    lines = [json.loads(x) for x in (cfg.run_dir / "generations.jsonl").read_text().splitlines()]
    assert lines == [{"step": 2, **g} for g in GENERATIONS]
    (evaluation,) = [json.loads(x) for x in (cfg.run_dir / "eval.jsonl").read_text().splitlines()]
    assert "generations" not in evaluation and evaluation["greedy_accuracy"] == 0.625  # the numbers only
    events = EventAccumulator(str(cfg.run_dir / "tb"), size_guidance={"tensors": 0})
    events.Reload()
    (text,) = events.Tensors("eval/generations/text_summary")
    markdown = text.tensor_proto.string_val[0].decode()
    assert text.step == 2 and "**Prompt:** 2+2=" in markdown and "**Sampled (score 0.0):** #5" in markdown
    (run_file,) = wandb_helpers.run_files(offline)
    row = wandb_helpers.history(run_file)[2]  # the table's fields, flattened as eval/generations/<field>
    table = {k.removeprefix("eval/generations/"): v for k, v in row.items() if k.startswith("eval/generations/")}
    assert table["_type"] == "table-file" and table["nrows"] == 2 and table["ncols"] == 8
    saved = json.loads((run_file.parent / "files" / table["path"]).read_text())
    assert saved["columns"][:2] == ["data_source", "problem_id"] and saved["data"][0][4] == "#4"


def test_a_resume_cuts_generations_back_to_the_checkpoint(tmp_path):
    cfg = build_config({"run": {"name": "gen", "output_dir": str(tmp_path / "runs")}})
    outputs = RunOutputs(cfg, resume_step=None)
    for step in (2, 4):
        outputs.log_eval({**EVAL, "step": step, "generations": [dict(GENERATIONS[0])]})
    outputs.close()
    RunOutputs(cfg, resume_step=3).close()
    steps = [json.loads(x)["step"] for x in (cfg.run_dir / "generations.jsonl").read_text().splitlines()]
    assert steps == [2]


def test_without_logging_wandb_nothing_is_written(tmp_path, offline):
    cfg = build_config({"run": {"name": "plain", "output_dir": str(tmp_path / "runs")}})
    outputs = RunOutputs(cfg, resume_step=None)
    outputs.log_step(dict(STEPS[0]))
    outputs.close()
    assert outputs.wandb is None and wandb_helpers.run_files(offline) == [] and not (cfg.run_dir / ID_FILE).exists()


def test_a_missing_wandb_package_names_the_field_and_the_extra(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # import wandb raises ImportError
    with pytest.raises(ConfigError, match=r"logging\.wandb.*stare\[wandb\]"):
        RunOutputs(config(tmp_path), resume_step=None)


def test_bad_wandb_settings_name_the_field(tmp_path):
    with pytest.raises(ConfigError, match=r"logging\.wandb\.mode"):
        config(tmp_path, mode="cloud")
    with pytest.raises(ConfigError, match=r"logging\.wandb\.project"):
        build_config({"logging": {"wandb": {"mode": "offline"}}})
