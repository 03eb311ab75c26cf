"""scripts/prepare_data.py: each input layout -> verl parquet that stare.data.tasks.dataset loads."""

import json
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from stare.data.prepare import INSTRUCTION
from stare.data.tasks.dataset import load_problems

SCRIPT = Path(__file__).parents[2] / "scripts" / "prepare_data.py"


def _run(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], capture_output=True, text=True, timeout=120)


def _jsonl(path: Path, rows) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_verl_training_rows_are_kept_and_deduplicated(tmp_path):
    dapo = [
        {
            "data_source": "math_dapo",
            "prompt": [{"role": "user", "content": f"Q{i % 3}. Answer: $Answer"}],
            "reward_model": {"ground_truth": str(i % 3), "style": "rule"},
            "extra_info": {"index": f"id{i}"},
        }
        for i in range(7)
    ]
    dapo.append({**dapo[0], "reward_model": {"ground_truth": "99", "style": "rule"}})  # same prompt, other answer
    src = tmp_path / "dapo.parquet"
    pq.write_table(pa.Table.from_pylist(dapo), src)
    done = _run("--out-dir", tmp_path / "out", "--train", src)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["train"] == {"rows": 8, "written": 3, "duplicates": 5, "conflicts": 1}
    problems = load_problems(tmp_path / "out" / "train.parquet")
    assert [(p.prompt, p.answer, p.data_source) for p in problems] == [
        (f"Q{i}. Answer: $Answer", str(i), "math_dapo") for i in range(3)
    ]


def test_question_answer_layouts_get_the_reference_boxed_instruction(tmp_path):
    cleaned = tmp_path / "cleaned.parquet"  # DAPO-Math-17K-cleaned: prompt (a string), target
    pq.write_table(pa.Table.from_pylist([{"prompt": "What is 1+1?", "target": "2", "ability": "MATH"}]), cleaned)
    math500 = _jsonl(
        tmp_path / "math500.jsonl",
        [{"problem": "Compute $\\frac12+\\frac12$.", "answer": "1", "level": 2, "unique_id": "test/x/1.json"}],
    )
    aime24 = tmp_path / "aime24.json"  # a JSON list, capitalised keys, an int answer
    aime24.write_text(json.dumps([{"ID": "2024-I-1", "Problem": "Find $n$.", "Answer": 204, "Solution": "..."}]))
    amc = tmp_path / "amc.parquet"  # float answers
    pq.write_table(pa.Table.from_pylist([{"id": 0, "problem": "How many?", "answer": 142.0, "url": "u"}]), amc)
    aime25 = _jsonl(tmp_path / "aime25.jsonl", [{"question": "Find $m$.", "answer": "70"}])
    out = tmp_path / "out"
    done = _run(
        "--out-dir",
        out,
        "--train",
        cleaned,
        "--eval",
        f"aime24={aime24}",
        "--eval",
        f"aime25={aime25}",
        "--eval",
        f"amc={amc}",
        "--eval",
        f"math500={math500}",
    )
    assert done.returncode == 0, done.stderr
    got = {name: load_problems(out / f"{name}.parquet") for name in ("train", "aime24", "aime25", "amc", "math500")}
    assert got["train"][0].prompt == "What is 1+1?" + INSTRUCTION and got["train"][0].data_source == "math_dapo"
    assert (got["aime24"][0].answer, got["aime24"][0].problem_id) == ("204", "aime24-2024-I-1")
    assert got["amc"][0].answer == "142" and got["amc"][0].data_source == "amc"
    assert got["aime25"][0].prompt == "Find $m$." + INSTRUCTION
    assert (got["math500"][0].level, got["math500"][0].problem_id) == (2, "math500-test/x/1.json")


@pytest.mark.parametrize(
    "row, message",
    [
        ({"question": "Q?"}, "neither a verl row"),
        ({"problem": "", "answer": "1"}, "field 'problem' must be a non-empty string"),
        ({"data_source": "x", "prompt": "Q", "reward_model": {"ground_truth": None}}, "reward_model.ground_truth"),
    ],
)
def test_a_bad_row_is_named_with_its_file_and_number(tmp_path, row, message):
    src = _jsonl(tmp_path / "bad.jsonl", [{"problem": "ok?", "answer": "1"}, row])
    done = _run("--out-dir", tmp_path / "out", "--eval", f"x={src}")
    assert done.returncode == 1 and "bad.jsonl line 2" in done.stderr and message in done.stderr


def test_an_eval_spec_without_a_name_is_refused(tmp_path):
    done = _run("--eval", str(tmp_path / "a.jsonl"))
    assert done.returncode == 2 and "NAME=FILE" in done.stderr
