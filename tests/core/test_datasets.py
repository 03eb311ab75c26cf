"""Data files: verl-format parquet/jsonl -> Problems, DatasetTask, the DAPO-Math prep script, and
per-source evaluation. All data is synthetic, written by the tests in the real formats."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from rollout.engines.base import Completion
from stare.data.tasks.dataset import DatasetError, DatasetTask, load_problems, prepare_dapo_math, problem_from_row
from stare.data.tasks.registry import build_task

REPO = Path(__file__).resolve().parents[2]
DAPO_INSTRUCTION = (
    "Solve the following math problem step by step. The last line of your response should be of the "
    "form Answer: $Answer (without quotes) where $Answer is the answer to the problem.\n\n{}\n\n"
    'Remember to put your answer on its own line after "Answer:".'
)


def dapo_row(question: str, answer, index: str | None = None, source: str = "math_dapo") -> dict:
    row = {
        "data_source": source,
        "prompt": [{"role": "user", "content": DAPO_INSTRUCTION.format(question)}],
        "ability": "MATH",
        "reward_model": {"ground_truth": answer, "style": "rule-lighteval/MATH_v2"},
    }
    if index is not None:
        row["extra_info"] = {"index": index}
    return row


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def write_parquet(path: Path, rows: list[dict]) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


ROWS = [
    dapo_row("What is 6*7?", "42", "a1"),
    dapo_row("What is 2+2?", "4", "a2"),
    dapo_row("Half of 1?", "\\frac{1}{2}"),
]


# --- rows -> problems --------------------------------------------------------------------------


def test_jsonl_rows_become_problems_with_messages_joined_without_a_chat_template(tmp_path):
    problems = load_problems(write_jsonl(tmp_path / "d.jsonl", ROWS))
    assert [p.answer for p in problems] == ["42", "4", "\\frac{1}{2}"]
    assert problems[0].prompt == DAPO_INSTRUCTION.format("What is 6*7?")
    assert [p.problem_id for p in problems[:2]] == ["math_dapo-a1", "math_dapo-a2"]
    assert problems[2].problem_id.startswith("math_dapo-") and len(problems[2].problem_id) == len("math_dapo-") + 12
    assert {p.data_source for p in problems} == {"math_dapo"} and {p.level for p in problems} == {1}


def test_parquet_reads_the_same_problems_as_jsonl(tmp_path):
    assert load_problems(write_parquet(tmp_path / "d.parquet", ROWS)) == load_problems(
        write_jsonl(tmp_path / "d.jsonl", ROWS)
    )


def test_chat_template_is_applied_when_the_tokenizer_has_one(tmp_path):
    from stare.models.tiny import build_tokenizer

    tok = build_tokenizer(["abc"])
    tok.chat_template = (
        "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}{% endfor %}"
        "{% if add_generation_prompt %}<|assistant|>{% endif %}"
    )
    rows = [
        {
            "data_source": "s",
            "prompt": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "1+1?"}],
            "reward_model": {"ground_truth": "2"},
        }
    ]
    [p] = load_problems(write_jsonl(tmp_path / "d.jsonl", rows), tok)
    assert p.prompt == "<|system|>Be brief.<|user|>1+1?<|assistant|>"
    [plain] = load_problems(tmp_path / "d.jsonl")
    assert plain.prompt == "Be brief.\n\n1+1?"


def test_string_prompt_numeric_answer_and_level_from_extra_info():
    row = {
        "data_source": "aime",
        "prompt": "Find x.",
        "reward_model": {"ground_truth": 204},
        "extra_info": {"level": 3},
    }
    p = problem_from_row(row, "row 0")
    assert (p.prompt, p.answer, p.level) == ("Find x.", "204", 3)


@pytest.mark.parametrize(
    ("change", "field"),
    [
        (lambda r: r.pop("prompt"), "'prompt'"),
        (lambda r: r.update(prompt=[]), "'prompt'"),
        (lambda r: r.update(prompt=[{"role": "user"}]), "'prompt[0]'"),
        (lambda r: r.pop("reward_model"), "'reward_model.ground_truth'"),
        (lambda r: r.update(reward_model={"style": "rule"}), "'reward_model.ground_truth'"),
        (lambda r: r.update(reward_model={"ground_truth": ["1", "2"]}), "'reward_model.ground_truth'"),
        (lambda r: r.update(reward_model={"ground_truth": "  "}), "'reward_model.ground_truth'"),
        (lambda r: r.pop("data_source"), "'data_source'"),
        (lambda r: r.update(extra_info=[1]), "'extra_info'"),
    ],
)
def test_bad_row_error_names_the_file_row_and_field(tmp_path, change, field):
    rows = [dict(r) for r in ROWS]
    change(rows[1])
    path = write_jsonl(tmp_path / "d.jsonl", rows)
    with pytest.raises(DatasetError, match=rf"d.jsonl line 2: .*{re.escape(field)}"):
        load_problems(path)


def test_bad_json_line_and_unknown_suffix_are_named(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps(ROWS[0]) + "\n\n{oops\n")
    with pytest.raises(DatasetError, match="line 3: not valid JSON"):
        load_problems(path)
    with pytest.raises(DatasetError, match="unknown file type '.csv'"):
        load_problems(write_jsonl(tmp_path / "d.csv", ROWS))
    with pytest.raises(DatasetError, match="no such file"):
        load_problems(tmp_path / "missing.jsonl")


# --- DatasetTask -------------------------------------------------------------------------------


def many_rows(n: int, source: str = "math_dapo") -> list[dict]:
    return [dapo_row(f"What is {i} + {i}?", str(2 * i), f"id{i}", source) for i in range(n)]


def test_without_test_path_a_fixed_twentieth_is_held_out_and_kept_out_of_train(tmp_path):
    task = build_task("dataset", path=write_jsonl(tmp_path / "d.jsonl", many_rows(400)))
    train, test = task.problems("train", 10_000, 0), task.problems("test", 10_000, 0)
    assert len(train) + len(test) == 400 and 8 <= len(test) <= 40  # 1/20 of 400 = 20 expected
    assert not {p.prompt for p in train} & {p.prompt for p in test}
    again = DatasetTask(tmp_path / "d.jsonl")
    assert {p.problem_id for p in again.problems("test", 10_000, 5)} == {p.problem_id for p in test}


def test_test_path_gives_the_test_split_and_problems_are_seeded_and_capped(tmp_path):
    train_file = write_jsonl(tmp_path / "train.jsonl", many_rows(30))
    test_file = write_jsonl(tmp_path / "aime.jsonl", many_rows(5, source="aime"))
    task = DatasetTask(train_file, test_path=test_file)
    assert len(task.problems("train", 100, 0)) == 30  # every training row, none held out
    assert {p.data_source for p in task.problems("test", 100, 0)} == {"aime"}
    assert task.problems("train", 7, 1) == task.problems("train", 7, 1)
    assert task.problems("train", 7, 1) != task.problems("train", 7, 2)
    with pytest.raises(ValueError, match="split"):
        task.problems("val", 1, 0)


def test_reward_is_math_equivalence_of_the_final_answer_and_never_raises(tmp_path):
    task = DatasetTask(write_jsonl(tmp_path / "d.jsonl", ROWS))
    by_answer = {p.answer: p for p in load_problems(tmp_path / "d.jsonl")}
    assert task.reward(by_answer["42"], "6 times 7.\nAnswer: 42") == 1.0
    assert task.reward(by_answer["\\frac{1}{2}"], "so \\boxed{0.5}") == 1.0
    assert task.reward(by_answer["42"], "Answer: 41") == 0.0
    assert task.reward(by_answer["42"], "no answer at all") == 0.0
    assert task.extract_answer("Answer: 42") == "42"
    bad_gold = type(by_answer["42"])(prompt="", answer="\\frac{", problem_id="x", level=1, data_source="s")
    assert task.reward(bad_gold, "Answer: 1") == 0.0


def test_config_needs_a_path_and_a_model_for_the_dataset_task(tmp_path):
    from stare.config import ConfigError, build_config

    with pytest.raises(ConfigError, match="task.path is required"):
        build_config({"task": {"name": "dataset"}, "model": {"path": str(tmp_path)}})
    with pytest.raises(ConfigError, match="needs model.path"):
        build_config({"task": {"name": "dataset", "path": "d.jsonl"}})
    with pytest.raises(ConfigError, match="task.path is required"):
        build_config({"task": {"path": "d.jsonl"}})
    cfg = build_config({"task": {"name": "dataset", "path": "d.jsonl"}, "model": {"path": str(tmp_path)}})
    assert cfg.task.build_kwargs(None) == {"path": Path("d.jsonl"), "test_path": None, "tokenizer": None}


# --- DAPO-Math prep ----------------------------------------------------------------------------


def dapo_raw_rows() -> list[dict]:
    """Like the real file: each problem repeated (with fresh ids), plus one conflicting repeat."""
    rows = []
    for rep in range(3):
        rows += [dapo_row(f"Compute {i}^2.", str(i * i), f"uuid-{rep}-{i}") for i in range(10)]
    rows.append(dapo_row("Compute 3^2.", "10", "uuid-bad"))  # same prompt, different answer
    return rows


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_prep_script_dedupes_and_splits(tmp_path, fmt):
    rows = dapo_raw_rows()
    src = (write_jsonl if fmt == "jsonl" else write_parquet)(tmp_path / f"dapo.{fmt}", rows)
    out = tmp_path / "out"
    proc = subprocess.run(
        [
            sys.executable,
            str(REPO / "scripts" / "prep_dapo_math.py"),
            str(src),
            "--out-dir",
            str(out),
            "--heldout",
            "3",
            "--seed",
            "1",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    counts = json.loads(proc.stdout)
    assert counts == {"rows": 31, "unique": 10, "duplicates": 21, "conflicts": 1, "train": 7, "heldout": 3}
    train, held = load_problems(out / "train.jsonl"), load_problems(out / "heldout.jsonl")
    assert len(train) == 7 and len(held) == 3
    assert not {p.prompt for p in train} & {p.prompt for p in held}
    # The first occurrence wins: original ids of repeat 0, the first answer.
    assert {p.problem_id for p in train + held} == {f"math_dapo-uuid-0-{i}" for i in range(10)}
    assert {p.answer for p in train + held} == {str(i * i) for i in range(10)}
    first = json.loads((out / "train.jsonl").read_text().splitlines()[0])
    assert first["extra_info"]["split"] == "train" and first["reward_model"]["style"] == "rule-lighteval/MATH_v2"


def test_prep_is_deterministic_in_the_seed(tmp_path):
    src = write_jsonl(tmp_path / "dapo.jsonl", dapo_raw_rows())
    prepare_dapo_math(src, tmp_path / "a", heldout=4, seed=3)
    prepare_dapo_math(src, tmp_path / "b", heldout=4, seed=3)
    prepare_dapo_math(src, tmp_path / "c", heldout=4, seed=4)
    read = lambda d: (d / "heldout.jsonl").read_text()  # noqa: E731
    assert read(tmp_path / "a") == read(tmp_path / "b") != read(tmp_path / "c")


def test_prep_script_reports_a_bad_row(tmp_path):
    rows = dapo_raw_rows()
    del rows[4]["reward_model"]
    src = write_jsonl(tmp_path / "dapo.jsonl", rows)
    proc = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "prep_dapo_math.py"), str(src), "--out-dir", str(tmp_path / "o")],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 1 and "dapo.jsonl line 5: missing field 'reward_model.ground_truth'" in proc.stderr


# --- evaluation per data source ----------------------------------------------------------------


class AnswerEngine:
    """Answers prompt i's k samples with the texts in `answers[prompt]` (cycled)."""

    weight_version = 0

    def __init__(self, tok, answers: dict[str, list[str]]):
        self.tok, self.answers = tok, answers

    def generate(self, prompts, params):
        out = []
        for p in prompts:
            texts = self.answers[self.tok.decode(p)]
            out.append(
                [
                    Completion(self.tok.encode(texts[j % len(texts)], add_special_tokens=False), [-1.0], "stop")
                    for j in range(params.n)
                ]
            )
        return out


def test_evaluation_reports_pass_and_avg_at_k_per_data_source(tmp_path):
    from rollout.evaluation import evaluate
    from stare.models.tiny import build_tokenizer

    rows = [
        {"data_source": src, "prompt": q, "reward_model": {"ground_truth": a}}
        for src, q, a in [("aime", "q1", "1"), ("aime", "q2", "2"), ("amc", "q3", "3")]
    ]
    path = write_jsonl(tmp_path / "t.jsonl", rows)
    task = DatasetTask(path, test_path=path)
    tok = build_tokenizer(["Aabcdefghijklmnopqrstuvwxyz0123456789: \n"])
    # k=4. q1: 1 of 4 right; q2: none; q3: all 4. Greedy (n=1) takes the first text.
    engine = AnswerEngine(
        tok, {"q1": ["Answer: 1", "Answer: 0", "Answer: 0", "Answer: 0"], "q2": ["Answer: 0"], "q3": ["Answer: 3"]}
    )
    result = evaluate(engine, tok, task, task.problems("test", 10, 0), k=4, max_new_tokens=8, stop_token_ids=(), seed=0)
    assert result["pass_at_k_per_source"] == {"aime": 0.5, "amc": 1.0}
    assert result["avg_at_k_per_source"] == {"aime": pytest.approx((0.25 + 0.0) / 2), "amc": 1.0}
    assert result["avg_at_k"] == pytest.approx((0.25 + 0 + 1) / 3)
    assert "tool_call_rate" not in result
