"""The chat-arithmetic task: chat-template prompts, disjoint seeded splits, math-verify \\boxed{} reward."""

import re

import pytest

from stare.config import ConfigError, build_config
from stare.data.tasks import build_task
from stare.data.tasks.chat_arithmetic import LEVELS
from stare.models.tiny import build_tokenizer

TEMPLATE = "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}"


@pytest.fixture(scope="module")
def tok():
    t = build_tokenizer(["abc"])
    t.chat_template = TEMPLATE
    return t


def _question(prompt: str) -> tuple[int, str, int]:
    a, op, b = re.findall(r"<user>What is (\d+) ([+-]) (\d+)\?", prompt)[-1]
    return int(a), op, int(b)


def test_prompt_is_the_one_shot_chat_and_the_answer_is_right(tok):
    task = build_task("chat-arithmetic", tokenizer=tok)
    for p in task.problems("train", 30, 0):
        assert p.prompt.startswith("<user>What is 2 + 3? Put the final answer in \\boxed{}.\n<assistant>2 + 3 = 5.")
        assert p.prompt.endswith("<assistant>")
        a, op, b = _question(p.prompt)
        assert LEVELS[p.level][0] == op and int(p.answer) == (a + b if op == "+" else a - b)


def test_splits_are_disjoint_and_seeded(tok):
    task = build_task("chat-arithmetic", tokenizer=tok)
    train = {_question(p.prompt) for p in task.problems("train", 500, 0)}
    test = {_question(p.prompt) for p in task.problems("test", 100, 0)}
    assert train and test and not train & test
    assert task.problems("test", 5, 1) == task.problems("test", 5, 1) != task.problems("test", 5, 2)


def test_reward_reads_the_last_boxed_answer(tok):
    task = build_task("chat-arithmetic", tokenizer=tok)
    p = task.problems("test", 1, 0)[0]
    assert task.reward(p, f"so \\boxed{{{p.answer}}}.") == 1.0
    assert task.reward(p, f"{p.answer}") == 0.0  # no box, no answer
    assert task.reward(p, f"\\boxed{{{int(p.answer) + 1}}}") == 0.0


def test_a_scoring_only_task_needs_no_tokenizer_but_cannot_draw_problems():
    task = build_task("chat-arithmetic")
    with pytest.raises(ValueError, match="tokenizer"):
        task.problems("train", 1, 0)


def test_a_tokenizer_without_chat_template_and_the_tiny_model_are_refused():
    with pytest.raises(ValueError, match="chat template"):
        build_task("chat-arithmetic", tokenizer=build_tokenizer(["abc"]))
    with pytest.raises(ConfigError, match="needs model.path"):
        build_config({"task": {"name": "chat-arithmetic"}})
    assert build_config({"task": {"name": "chat-arithmetic"}, "model": {"source": "smollm2"}}).model.source == "smollm2"
