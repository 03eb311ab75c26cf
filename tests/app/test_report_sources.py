"""The report's per-data-source table: avg@n and pass@n of the last evaluation, with its sampling."""

import json

from stare.app.report import summarize, write_report


def test_report_shows_avg_and_pass_at_n_per_source_of_the_last_evaluation(tmp_path):
    run = tmp_path / "r"
    run.mkdir()
    (run / "metrics.jsonl").write_text(
        json.dumps({"step": 1, "algo": "stare", "entropy": 0.3, "reward_mean": 0.5}) + "\n"
    )
    source = {
        "problems": 30,
        "n": 32,
        "temperature": 1.0,
        "top_p": 0.7,
        "greedy_accuracy": 0.1,
        "avg_at_n": 0.125,
        "pass_at_n": 0.5,
    }
    evals = [
        {"step": 0, "per_source": {"aime24": {**source, "avg_at_n": 0.0}}},
        {"step": 1, "per_source": {"aime24": source}},
    ]
    (run / "eval.jsonl").write_text("".join(json.dumps(e) + "\n" for e in evals))
    assert summarize(run)["per_source_last"] == {"aime24": source}
    md = (write_report(run) / "summary.md").read_text()
    assert "| aime24 | 30 | 32 | 1.00 | 0.70 | 0.1250 | 0.5000 | 0.1000 |" in md
