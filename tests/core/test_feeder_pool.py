"""The feeder's pool and epochs (stare/data/feeder.py): a dataset is used whole however large (data.max_prompts
cuts it, said in the log), a generated task keeps its 20,000 draws, data.epochs hands out exactly epochs x pool
prompts (each epoch a permutation of the pool) and derives run.steps, and the tokenizer's unknown-token share of
the prompts is warned about."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from stare.config import ConfigError, build_config
from stare.data.feeder import GENERATED_POOL, build_feeder, run_steps
from stare.data.tasks.arithmetic import ArithmeticTask
from stare.data.tasks.dataset import DatasetTask

ROWS = 25_000


class CharTokenizer:
    """A character tokenizer over the arithmetic alphabet with an unknown token, id 2 (as the tiny model's)."""

    unk_token, unk_token_id, chat_template = "<unk>", 2, None
    vocab = {c: i + 3 for i, c in enumerate("0123456789+-*=;#")}

    def encode(self, text, add_special_tokens=False):
        return [self.vocab.get(c, self.unk_token_id) for c in text]

    def decode(self, ids, skip_special_tokens=False):
        chars = {i: c for c, i in self.vocab.items()}
        return "".join(chars.get(i, "" if skip_special_tokens else self.unk_token) for i in ids)


class DroppingTokenizer(CharTokenizer):
    """The same alphabet, unknown characters dropped instead of mapped to <unk> (what the tiny model's
    character vocabulary does when transformers loads it as another tokenizer class)."""

    def encode(self, text, add_special_tokens=False):
        return [self.vocab[c] for c in text if c in self.vocab]

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": self.encode(text)}


def _dataset(path, rows, prompt=lambda i: f"{i}+1="):
    with path.open("w") as f:
        for i in range(rows):
            row = {"data_source": "big", "prompt": prompt(i), "reward_model": {"ground_truth": str(i + 1)}}
            f.write(json.dumps({**row, "extra_info": {"index": i}}) + "\n")
    return path


@pytest.fixture(scope="module")
def big(tmp_path_factory):
    folder = tmp_path_factory.mktemp("data")
    return DatasetTask(_dataset(folder / "train.jsonl", ROWS), test_path=_dataset(folder / "test.jsonl", 10))


def _cfg(**data):
    return build_config({"data": data, "rollout": {"prompts_per_step": 64}})


def test_a_25000_prompt_dataset_is_used_whole(big):
    said = []
    feeder = build_feeder(_cfg(), big, CharTokenizer(), said.append)
    assert len(feeder.pool) == ROWS and len({p.problem_id for p in feeder.pool}) == ROWS
    assert any("training pool: 25,000 prompts (the task's every training prompt)" in s for s in said), said


def test_max_prompts_cuts_a_larger_dataset_and_says_so(big):
    said = []
    feeder = build_feeder(_cfg(max_prompts=20_000), big, CharTokenizer(), said.append)
    assert len(feeder.pool) == 20_000
    assert any("data.max_prompts=20,000: training on 20,000 of the task's 25,000" in s for s in said), said


def test_a_generated_task_keeps_its_20000_draws():
    said = []
    feeder = build_feeder(_cfg(), ArithmeticTask(), CharTokenizer(), said.append)
    assert len(feeder.pool) == GENERATED_POOL == 20_000
    assert not any("max_prompts" in s for s in said) and any("drawn from the generated task" in s for s in said)


def test_epochs_hand_out_each_prompt_once_per_epoch_then_stop(tmp_path):
    task = DatasetTask(_dataset(tmp_path / "t.jsonl", 10), test_path=_dataset(tmp_path / "h.jsonl", 2))
    feeder = build_feeder(_cfg(epochs=3), task, CharTokenizer(), lambda s: None)
    got = [t for _ in range(5) for t in feeder.next_tasks(7)]  # 35 asked, 30 there
    assert len(got) == 30 and feeder.exhausted and feeder.next_tasks(5) == []
    for epoch in range(3):  # every epoch is a permutation of the pool
        assert sorted(t.problem_id for t in got[10 * epoch : 10 * epoch + 10]) == sorted(
            p.problem_id for p in feeder.pool
        )
    assert [t.problem_id for t in got[:10]] != [t.problem_id for t in got[10:20]]  # each in its own order
    assert Counter(t.cursor for t in got) == Counter(range(30))
    resumed = build_feeder(_cfg(epochs=3), task, CharTokenizer(), lambda s: None)
    resumed.load_state_dict({"cursor": 25})
    assert [t.problem_id for t in resumed.next_tasks(10)] == [t.problem_id for t in got[25:]]


def test_run_steps_derived_from_epochs(big):
    said = []
    derived = build_config({"run": {"steps": None}, "data": {"epochs": 2}, "rollout": {"prompts_per_step": 64}})
    feeder = build_feeder(derived, big, CharTokenizer(), said.append)
    assert run_steps(derived, feeder, said.append) == 2 * ROWS // 64 == 781  # 50,000 / 64, the last 16 dropped
    assert said[-1] == "data.epochs=2 over 25,000 prompts at 64 per step: 781 steps (run.steps)"
    both = build_config({"run": {"steps": 100}, "data": {"epochs": 2}, "rollout": {"prompts_per_step": 64}})
    assert run_steps(both, feeder, said.append) == 100 and "run.steps=100 ends the run first" in said[-1]
    assert run_steps(_cfg(), feeder, said.append) == 150  # no epochs: run.steps as given
    with pytest.raises(ConfigError, match="run.steps is null but data.epochs is not set"):
        build_config({"run": {"steps": None}})


@pytest.mark.parametrize("tokenizer", [CharTokenizer(), DroppingTokenizer()], ids=["unk", "dropped"])
def test_prompts_the_tokenizer_does_not_cover_are_warned_about(tmp_path, tokenizer):
    # "What is 7 plus one? Answer: ": 28 characters, 22 of them not spaces; the alphabet covers one ("7"):
    # 21 / 22 non-space characters lost (95%); as tokens, 27 of the 28 are <unk> (or dropped)
    chat = DatasetTask(
        _dataset(tmp_path / "chat.jsonl", 1, prompt=lambda i: f"What is {i + 7} plus one? Answer: "),
        test_path=_dataset(tmp_path / "h.jsonl", 2),
    )
    said = []
    feeder = build_feeder(_cfg(), chat, tokenizer, said.append)
    (line,) = [s for s in said if "lost by the tokenizer" in s]
    assert line.startswith("warning: training prompts: 95% of their characters are lost by the tokenizer")
    assert "model.path" in line
    unk = 0.0 if isinstance(tokenizer, DroppingTokenizer) else 27 / 28
    assert feeder.coverage == {"data_unk_rate": pytest.approx(unk), "data_chars_lost": pytest.approx(21 / 22)}
    said.clear()
    covered = build_feeder(_cfg(), ArithmeticTask(), tokenizer, said.append)  # its own alphabet: covered
    assert not any("lost by the tokenizer" in s for s in said)
    assert covered.coverage == {"data_unk_rate": 0.0, "data_chars_lost": 0.0}
