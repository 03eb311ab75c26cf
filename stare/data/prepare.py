"""Training and evaluation sets in verl's parquet format, from local files (`scripts/prepare_data.py`).

Input layouts, told apart per row (each file may be .parquet, .jsonl or .json: a list of rows):

- verl rows (`reward_model.ground_truth` present): DAPO-Math-17k as published, or files verl
  already wrote. Kept as they are (prompt included), checked like `stare.data.tasks.dataset.problem_from_row`.
- question/answer rows: a question under `problem`, `Problem`, `question` or `prompt` (a string)
  and the answer under `answer`, `Answer`, `target` or `ground_truth`: DAPO-Math-17K-cleaned
  (prompt, target), MATH-500 (problem, answer, level), AIME 2024 (Problem, Answer), AIME 2025
  (problem or question, answer), AMC (problem, answer, often a float such as 142.0, written 142).
  The prompt is one user message: the question plus the reference recipe's instruction
  (hp-luo/STARE recipe/STARE/datasets/dapo_17k_text_train.py):
  "\\nPlease reason step by step, and put your final answer within \\\\boxed{}."

Output rows: {"data_source", "prompt": [{"role": "user", "content"}], "ability": "math",
"reward_model": {"style": "rule", "ground_truth"}, "extra_info": {"split", "index", "level"?}}.
Training rows are deduplicated by prompt text (DAPO-Math-17k repeats each problem ~100 times);
a repeat with another answer is counted as a conflict and dropped. Evaluation rows are kept all.

Nothing is downloaded: pass the files you have.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from stare.data.tasks.dataset import (
    DatasetError,
    _prompt_key,
    ground_truth,
    located_rows,
    problem_from_row,
    prompt_messages,
)

INSTRUCTION = "\nPlease reason step by step, and put your final answer within \\boxed{}."
QUESTION_KEYS = ("problem", "Problem", "question", "prompt")
ANSWER_KEYS = ("answer", "Answer", "target", "ground_truth")


def read_rows(path: Path | str) -> list[tuple[int, str, dict[str, Any]]]:
    """(row index from 0, where, row) of a .parquet / .jsonl file (stare.data.tasks.dataset.located_rows,
    all columns) or a .json list; `where` is 1-based ("FILE line N", "FILE row N")."""
    path = Path(path)
    if path.suffix.lower() == ".json":
        from stare.config.files import FileInputError, read_text

        try:
            data = json.loads(read_text(path, "data file"))
        except FileInputError as err:
            raise DatasetError(str(err)) from None
        except ValueError as err:
            raise DatasetError(f"{path} line {getattr(err, 'lineno', '?')}: not valid JSON ({err})") from None
        if isinstance(data, dict) and isinstance(data.get("data"), list):
            data = data["data"]
        if not isinstance(data, list) or not all(isinstance(r, dict) for r in data):
            raise DatasetError(f"{path}: a .json file must hold a list of row objects (or {{'data': [...]}})")
        return [(i, f"{path} row {i + 1}", r) for i, r in enumerate(data)]
    if path.suffix.lower() == ".parquet":
        try:
            import pyarrow.parquet as pq
        except ImportError:
            raise DatasetError(f"{path}: reading parquet needs pyarrow: pip install 'stare[data]'") from None
        if not path.is_file():
            raise DatasetError(f"{path}: no such file")
        return [(i, f"{path} row {i + 1}", r) for i, r in enumerate(pq.read_table(path).to_pylist())]
    return list(located_rows(path))


def _answer_text(value: Any, where: str) -> str:
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return ground_truth({"reward_model": {"ground_truth": value}}, where)


def _first(row: dict[str, Any], keys: tuple[str, ...]) -> str | None:
    return next((k for k in keys if row.get(k) is not None), None)


def convert_row(row: dict[str, Any], *, data_source: str, split: str, index: int, where: str) -> dict[str, Any]:
    """One input row (either layout) -> one verl row."""
    if isinstance(row.get("reward_model"), dict):
        problem_from_row({"data_source": data_source, **row}, where)  # full check
        extra: dict[str, Any] = dict(row.get("extra_info") or {})
        extra.setdefault("index", index)
        extra["split"] = split
        return {
            "data_source": row.get("data_source") or data_source,
            "prompt": prompt_messages(row, where),
            "ability": row.get("ability") or "math",
            "reward_model": {**row["reward_model"], "ground_truth": ground_truth(row, where)},
            "extra_info": extra,
        }
    qkey, akey = _first(row, QUESTION_KEYS), _first(row, ANSWER_KEYS)
    if qkey is None or akey is None:
        raise DatasetError(
            f"{where}: neither a verl row (reward_model.ground_truth) nor a question/answer row "
            f"(a question under one of {QUESTION_KEYS} and an answer under one of {ANSWER_KEYS}); "
            f"it has {sorted(row)}"
        )
    question = row[qkey]
    if not isinstance(question, str) or not question.strip():
        raise DatasetError(f"{where}: field {qkey!r} must be a non-empty string")
    extra = {"split": split, "index": row.get("unique_id") or row.get("id") or row.get("ID") or index}
    extra["index"] = str(extra["index"])
    level = row.get("level")
    if isinstance(level, str) and level.startswith("Level "):
        level = level.removeprefix("Level ")
    if isinstance(level, (int, str)) and str(level).isdigit() and int(level) >= 1:
        extra["level"] = int(level)
    return {
        "data_source": data_source,
        "prompt": [{"role": "user", "content": question.strip() + INSTRUCTION}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": _answer_text(row[akey], f"{where} {akey!r}")},
        "extra_info": extra,
    }


def convert_file(src: Path | str, out: Path | str, *, data_source: str, split: str, dedupe: bool) -> dict[str, int]:
    """Convert `src` into the verl parquet `out`; returns the counts."""
    rows: list[dict[str, Any]] = []
    seen: dict[str, str] = {}  # prompt -> its answer
    total = conflicts = 0
    for i, where, row in read_rows(src):
        total += 1
        converted = convert_row(row, data_source=data_source, split=split, index=i, where=where)
        if dedupe:
            key = _prompt_key(converted["prompt"])
            answer = converted["reward_model"]["ground_truth"]
            if key in seen:
                conflicts += seen[key] != answer
                continue
            seen[key] = answer
        rows.append(converted)
    if not rows:
        raise DatasetError(f"{src}: no rows")
    write_parquet(rows, out)
    return {"rows": total, "written": len(rows), "duplicates": total - len(rows), "conflicts": conflicts}


def write_parquet(rows: list[dict[str, Any]], out: Path | str) -> None:
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise DatasetError("writing parquet needs pyarrow: pip install 'stare[data]'") from None
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), out)
