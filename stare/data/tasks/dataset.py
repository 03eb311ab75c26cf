"""Problems from data files: verl-format parquet / jsonl (DAPO-Math-17k, AIME sets) and `DatasetTask`.

One row is one problem, in the format verl's data preprocessing writes and the DAPO-Math-17k and
AIME parquet files use:

    {"data_source": "math_dapo",
     "prompt": [{"role": "user", "content": "Solve ... Answer: $Answer ..."}],   # or a string
     "reward_model": {"ground_truth": "34", "style": "rule"},
     "extra_info": {"index": "9a9b6eb4-..."}}                                      # optional

`load_problems(path, tokenizer)` turns rows into `Problem`s: the prompt through the tokenizer's
chat template when it has one (`add_generation_prompt=True`), else the messages' contents joined
by blank lines; the answer is `reward_model.ground_truth` as a string (numbers are accepted);
`problem_id` is `<data_source>-<extra_info.index>` when there is an index, else a hash of prompt
and answer; `level` is `extra_info.level` when it is a positive int, else 1. A row that lacks a
field or has the wrong type raises `DatasetError` naming the file, the row and the field.

`DatasetTask(path, test_path=None, tokenizer=None)` serves those problems to the trainer
(`task.name: dataset`, `task.path: FILE` in a config). Train split: the rows of `path`; test
split: the rows of `test_path` (one file or a list of files), or without one a fixed 1/20 of `path` chosen by a hash of the
prompt (then left out of train). Reward: `stare.data.tasks.math_verify.math_reward` (math-verify
equivalence of the final answer: `\\boxed{}`, `<answer>` or an "Answer:" line).

`prepare_dapo_math` (and `scripts/prep_dapo_math.py`) converts a local DAPO-Math-17k file (whose
17k problems are each repeated many times) into deduplicated train / held-out jsonl files.

Not covered: downloading (point it at local files), multi-modal rows, per-row reward styles other
than math answers (`reward_model.style` is kept in the file but not read), streaming files larger
than memory (rows are loaded into a list; DAPO-Math-17k's 1.8M rows load in a few GB).
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from stare.data.tasks.base import Problem, Split, chat_prompt, check_split

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from stare.config.reward import MathConfig

COLUMNS = ("data_source", "prompt", "reward_model", "extra_info")
"""The columns a verl-format file has (extra_info is optional)."""

_TEST_BUCKETS = 20  # without test_path, 1 in 20 prompts is held out


class DatasetError(ValueError):
    """A data file or row that cannot be read; the message names the file, the row and the field."""


def located_rows(path: Path | str) -> Iterator[tuple[int, str, dict[str, Any]]]:
    """(row index from 0, where, row): `where` is how every error names the row, 1-based like an
    editor: "FILE line N" in a text file (blank lines counted), "FILE row N" in a parquet file."""
    path = Path(path)
    if not path.is_file():
        raise DatasetError(f"{path}: no such file")
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        try:
            import pyarrow.parquet as pq
        except ImportError:
            raise DatasetError(f"{path}: reading parquet needs pyarrow: pip install 'stare[data]'") from None
        try:
            pf = pq.ParquetFile(path)
        except Exception as err:  # pyarrow's ArrowInvalid and friends: a file that is not parquet
            raise DatasetError(f"{path}: not a readable parquet file ({str(err)[:200]})") from None
        columns = [c for c in COLUMNS if c in pf.schema_arrow.names]
        index = 0
        for batch in pf.iter_batches(columns=columns, batch_size=4096):
            for row in batch.to_pylist():
                yield index, f"{path} row {index + 1}", row
                index += 1
    elif suffix in (".jsonl", ".ndjson"):
        with path.open("rb") as f:
            index = 0
            for line_no, raw in enumerate(f, 1):
                try:
                    line = raw.decode("utf-8")
                except UnicodeDecodeError as err:
                    raise DatasetError(
                        f"{path} line {line_no}: not UTF-8 (byte 0x{raw[err.start]:02x} at column "
                        f"{err.start + 1}); save the file as UTF-8"
                    ) from None
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except ValueError as err:
                    raise DatasetError(f"{path} line {line_no}: not valid JSON ({err})") from None
                if not isinstance(row, dict):
                    raise DatasetError(f"{path} line {line_no}: a row must be a JSON object")
                yield index, f"{path} line {line_no}", row
                index += 1
    else:
        raise DatasetError(f"{path}: unknown file type {suffix!r}; use .parquet or .jsonl")


def prompt_messages(row: dict[str, Any], where: str) -> list[dict[str, str]] | str:
    """The row's `prompt` checked: a string, or a non-empty list of {"role", "content"} messages."""
    if "prompt" not in row or row["prompt"] is None:
        raise DatasetError(f"{where}: missing field 'prompt' (a string or a list of chat messages)")
    prompt = row["prompt"]
    if isinstance(prompt, str):
        return prompt
    if not isinstance(prompt, list) or not prompt:
        raise DatasetError(f"{where}: field 'prompt' must be a string or a non-empty list of messages")
    for i, m in enumerate(prompt):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            raise DatasetError(f"{where}: field 'prompt[{i}]' must be an object with string 'role' and 'content'")
    return [{"role": m["role"], "content": m["content"]} for m in prompt]


def ground_truth(row: dict[str, Any], where: str) -> str:
    """`reward_model.ground_truth` as a string (ints and floats are written as they print)."""
    rm = row.get("reward_model")
    if not isinstance(rm, dict) or rm.get("ground_truth") is None:
        raise DatasetError(f"{where}: missing field 'reward_model.ground_truth'")
    gt = rm["ground_truth"]
    if isinstance(gt, bool) or not isinstance(gt, (str, int, float)):
        raise DatasetError(
            f"{where}: field 'reward_model.ground_truth' must be a string or a number, got {type(gt).__name__}"
        )
    gt = str(gt).strip()
    if not gt:
        raise DatasetError(f"{where}: field 'reward_model.ground_truth' is empty")
    return gt


def render_prompt(prompt: list[dict[str, str]] | str, tokenizer: PreTrainedTokenizerBase | None = None) -> str:
    """The prompt text: a string as is; messages through the tokenizer's chat template (with the
    generation prompt) when it has one, else their contents joined by blank lines."""
    if isinstance(prompt, str):
        return prompt
    if tokenizer is not None and getattr(tokenizer, "chat_template", None):
        return chat_prompt(tokenizer, prompt)
    return "\n\n".join(m["content"] for m in prompt)


def _prompt_key(prompt: list[dict[str, str]] | str) -> str:
    """Tokenizer-independent text of a prompt, for hashing and deduplication."""
    if isinstance(prompt, str):
        return prompt.strip()
    return "\n\n".join(f"{m['role']}: {m['content'].strip()}" for m in prompt)


def problem_from_row(row: dict[str, Any], where: str, tokenizer: PreTrainedTokenizerBase | None = None) -> Problem:
    """One verl-format row -> Problem (see the module docstring); `where` names the row in errors."""
    prompt = prompt_messages(row, where)
    answer = ground_truth(row, where)
    source = row.get("data_source")
    if not isinstance(source, str) or not source:
        raise DatasetError(f"{where}: missing field 'data_source' (a non-empty string)")
    extra = row.get("extra_info") or {}
    if not isinstance(extra, dict):
        raise DatasetError(f"{where}: field 'extra_info' must be an object when present")
    if extra.get("index") is not None:
        problem_id = f"{source}-{extra['index']}"
    else:
        problem_id = f"{source}-" + hashlib.sha256(f"{_prompt_key(prompt)}\0{answer}".encode()).hexdigest()[:12]
    level = extra.get("level")
    level = level if isinstance(level, int) and not isinstance(level, bool) and level >= 1 else 1
    return Problem(
        prompt=render_prompt(prompt, tokenizer),
        answer=answer,
        problem_id=problem_id,
        level=level,
        data_source=source,
        extra_info=_json_values(extra),
    )


def _json_values(extra: dict[str, Any]) -> dict[str, Any]:
    """`extra_info` as JSON values (it travels in wire records): what JSON cannot hold becomes its str()."""
    return json.loads(json.dumps(extra, default=str)) if extra else {}


def load_problems(path: Path | str, tokenizer: PreTrainedTokenizerBase | None = None) -> list[Problem]:
    """Every row of `path` as a Problem, in file order."""
    return [problem_from_row(row, where, tokenizer) for _, where, row in located_rows(path)]


def _held_out(row: dict[str, Any]) -> bool:
    digest = hashlib.sha256(_prompt_key(row["prompt"]).encode()).digest()
    return int.from_bytes(digest[:8], "big") % _TEST_BUCKETS == 0


class DatasetTask:
    """Problems from a verl-format file, rewarded by math answer equivalence; see the module docstring."""

    name = "dataset"

    def __init__(
        self,
        path: Path | str,
        test_path: Path | str | list[Path | str] | None = None,
        tokenizer: PreTrainedTokenizerBase | None = None,
        math_config: MathConfig | None = None,
    ) -> None:
        rows = list(located_rows(path))
        if not rows:
            raise DatasetError(f"{path}: no rows")
        train: list[Problem] = []
        test: list[Problem] = []
        for _, where, row in rows:
            problem = problem_from_row(row, where, tokenizer)
            (test if test_path is None and _held_out(row) else train).append(problem)
        if test_path is not None:
            paths = test_path if isinstance(test_path, (list, tuple)) else [test_path]
            test = [p for one in paths for p in load_problems(one, tokenizer)]
        self._splits: dict[str, list[Problem]] = {"train": train, "test": test}
        self.math_config = math_config

    def size(self, split: Split) -> int:
        """How many problems `split` holds (the feeder's pool is all of them unless data.max_prompts says)."""
        return len(self._splits[split])

    def problems(self, split: Split, n: int, seed: int) -> list[Problem]:
        """The first `n` problems of `split` in a seeded order (all of them when it has fewer)."""
        check_split(split, n)
        pool = list(self._splits[split])
        random.Random(f"dataset/{split}/{seed}").shuffle(pool)
        return pool[:n]

    def extract_answer(self, completion: str) -> str | None:
        from stare.data.tasks.math_verify import MathConfig, extract_answer

        return extract_answer(completion, (self.math_config or MathConfig()).extract_from)

    def reward(self, problem: Problem, completion: str) -> float:
        """1.0 if the final answer is equivalent to `problem.answer` (math-verify), else 0.0; a
        verifier timeout or an unparsable reference also gives 0.0 (never raises)."""
        from stare.data.tasks.math_verify import math_reward

        try:
            return math_reward(completion, problem.answer, self.math_config)
        except Exception:  # the reward must survive any policy output (and a bad reference)
            return 0.0


class DatasetVerifier:
    """The reward of `DatasetTask` without its problems: what a reward worker needs (`task.name:
    dataset` in a `stare reward` process, which has no data file mounted). The ground truth comes
    with each trajectory (answer, data_source, problem_id, level), so no file is opened."""

    name = "dataset"

    def __init__(self, math_config: MathConfig | None = None) -> None:
        self.math_config = math_config

    def problems(self, split: Split, n: int, seed: int) -> list[Problem]:
        raise DatasetError(
            "a verifier-only dataset task has no problems (it scores responses against the "
            "ground truth carried by each trajectory); build DatasetTask(path) to sample problems"
        )

    extract_answer = DatasetTask.extract_answer
    reward = DatasetTask.reward


def prepare_dapo_math(src: Path | str, out_dir: Path | str, *, heldout: int = 500, seed: int = 0) -> dict[str, int]:
    """Deduplicate a local DAPO-Math-17k file and split it into `out_dir/{train,heldout}.jsonl`.

    Rows are checked like `problem_from_row` (an error names the row); rows whose prompt text was
    seen before are dropped (the first answer is kept; a repeat with a different answer is counted
    as a conflict). The unique rows are shuffled with `seed`; the first `heldout` go to
    heldout.jsonl. Output rows keep the verl format, with `extra_info.index` (the original index,
    or the source row number) and `extra_info.split`. Returns the counts.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    seen: dict[str, str] = {}
    rows: list[dict[str, Any]] = []
    total = conflicts = 0
    for i, where, row in located_rows(src):
        total += 1
        prompt = prompt_messages(row, where)
        answer = ground_truth(row, where)
        problem_from_row(row, where)  # full check: data_source, extra_info
        key = _prompt_key(prompt)
        if key in seen:
            conflicts += seen[key] != answer
            continue
        seen[key] = answer
        extra = dict(row.get("extra_info") or {})
        extra.setdefault("index", i)
        reward_model = {**row["reward_model"], "ground_truth": answer}
        rows.append(
            {"data_source": row["data_source"], "prompt": prompt, "reward_model": reward_model, "extra_info": extra}
        )
    random.Random(seed).shuffle(rows)
    heldout = min(heldout, len(rows))
    splits = {"heldout": rows[:heldout], "train": rows[heldout:]}
    for name, part in splits.items():
        with (out / f"{name}.jsonl").open("w", encoding="utf-8") as f:
            for row in part:
                row["extra_info"]["split"] = name
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
    return {
        "rows": total,
        "unique": len(rows),
        "duplicates": total - len(rows),
        "conflicts": conflicts,
        "train": len(splits["train"]),
        "heldout": heldout,
    }
