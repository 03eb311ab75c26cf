"""data.max_prompt_len / data.prompt_overflow: applied once at load, counted and logged, never at rollout."""

import pytest

from stare.config import ConfigError, build_config
from stare.data.feeder import PromptFeeder, build_feeder, eval_problems
from stare.data.prompt_policy import PromptPolicyError, fit_prompts
from stare.data.tasks.base import Problem
from stare.models.tiny import build_tokenizer

TOK = build_tokenizer(["abcdefghij"])


def _problems(*prompts: str) -> list[Problem]:
    return [Problem(prompt=p, answer="1", problem_id=f"p{i}", level=1, data_source="s") for i, p in enumerate(prompts)]


class ListTask:
    name = "list"

    def __init__(self, problems):
        self._problems = problems

    def problems(self, split, n, seed):
        return self._problems[:n]


def test_truncate_left_keeps_the_last_tokens_and_logs_the_count():
    logs = []
    out = fit_prompts(_problems("abc", "abcdefgh"), TOK, 4, "truncate_left", what="training prompts", log=logs.append)
    assert [TOK.decode(list(p.prompt_token_ids)) for p in out] == ["abc", "efgh"]
    assert logs == [
        "training prompts: 1 of 2 prompts are longer than data.max_prompt_len=4 tokens (longest 8): "
        "truncated on the left (kept the last tokens) by data.prompt_overflow=truncate_left (p1)"
    ]


def test_reject_drops_the_long_prompts_and_names_them():
    logs = []
    out = fit_prompts(_problems("abc", "abcdefgh", "abcde"), TOK, 4, "reject", what="held-out prompts", log=logs.append)
    assert [p.problem_id for p in out] == ["p0"]
    assert "2 of 3 prompts" in logs[0] and "rejected (dropped)" in logs[0] and "(p1, p2)" in logs[0]


def test_rejecting_every_prompt_is_an_error_naming_the_fields():
    with pytest.raises(PromptPolicyError, match="raise data.max_prompt_len or set data.prompt_overflow=truncate_left"):
        fit_prompts(_problems("abcdefgh"), TOK, 4, "reject", what="training prompts", log=lambda _: None)


def test_without_a_cap_problems_pass_unchanged_and_are_encoded_at_rollout():
    problems = _problems("abcdefgh")
    assert fit_prompts(problems, TOK, None, "reject", what="x") is problems
    feeder = PromptFeeder(ListTask(problems), TOK, run_id="r", group_size=2, seed=0)
    assert feeder.next_tasks(1)[0].prompt_token_ids == TOK.encode("abcdefgh", add_special_tokens=False)


def test_feeder_and_eval_set_follow_the_config():
    cfg = build_config(
        {}, overrides=["data.max_prompt_len=3", "data.prompt_overflow=truncate_left", "task.eval_problems=2"]
    )
    task = ListTask(_problems("abcdef", "ab"))
    feeder = build_feeder(cfg, task, TOK, log=lambda _: None)
    assert [TOK.decode(t.prompt_token_ids) for t in feeder.next_tasks(2)] in (["def", "ab"], ["ab", "def"])
    assert [len(p.prompt_token_ids) for p in eval_problems(cfg, task, TOK, log=lambda _: None)] == [3, 2]


def test_a_bad_overflow_value_names_the_field():
    with pytest.raises(ConfigError, match="data.prompt_overflow"):
        build_config({}, overrides=["data.prompt_overflow=cut"])
