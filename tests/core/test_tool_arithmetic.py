"""The tool-arithmetic task and the tiny-model build's multi-turn support."""

from __future__ import annotations

import random

import pytest

from rollout.agent_loop import parse_tool_call, render_result
from stare.data.tasks import build_task
from stare.data.tasks.tool_arithmetic import RESPONSE_CLOSE, RESPONSE_OPEN, ToolArithmeticTask, simulate_product_program
from stare.sandbox import ProcessSandbox, SandboxConfig, best_isolation


@pytest.fixture(scope="module")
def task() -> ToolArithmeticTask:
    return build_task("tool-arithmetic")


def test_problems_are_products_with_disjoint_seeded_splits(task):
    train, test = task.problems("train", 400, 0), task.problems("test", 100, 0)
    assert not {p.prompt for p in train} & {p.prompt for p in test}
    assert task.problems("train", 400, 0) == train and task.problems("train", 400, 1) != train
    for p in train[:8]:
        a, b = p.prompt.removesuffix("=").split("*")
        assert (
            p.answer == str(int(a) * int(b))
            and (len(a), len(b)) == {1: (3, 2), 2: (3, 3), 3: (4, 3), 4: (4, 4)}[p.level]
        )


def test_reference_solution_calls_the_tool_and_is_right(task):
    p = task.problems("train", 1, 0)[0]
    a, b = p.prompt.removesuffix("=").split("*")
    segments = task.solution_segments(p)
    assert [trained for _, trained in segments] == [True, False, True]
    call, observation, answer = (text for text, _ in segments)
    assert parse_tool_call(call) == (f"print({a}*{b})", None)
    assert observation == f"{RESPONSE_OPEN}{p.answer}{RESPONSE_CLOSE}" and answer == f"#{p.answer}"
    assert task.reward(p, task.solution(p)) == 1.0


def test_solution_variants_answer_directly_at_the_configured_rate(task):
    p = task.problems("train", 1, 0)[0]
    rng = random.Random(0)
    direct = [len(task.solution_segments(p, rng)) == 1 for _ in range(2000)]
    assert 0.45 < sum(direct) / 2000 < 0.55  # direct_fraction = 0.5
    assert all(task.reward(p, task.solution(p, random.Random(s))) == 1.0 for s in range(20))
    assert ToolArithmeticTask(direct_fraction=0.0).solution(p, rng) == task.solution(p)


def test_only_the_answer_after_the_last_tool_response_counts(task):
    p = task.problems("train", 1, 0)[0]
    obs = f"{RESPONSE_OPEN}#{p.answer}{RESPONSE_CLOSE}"
    assert task.reward(p, f"#{p.answer}") == 1.0  # a direct answer
    assert task.reward(p, f"x{obs}") == 0.0  # the tool printed "#answer": not the model's answer
    assert task.reward(p, f"x{obs}#{p.answer}") == 1.0
    assert task.reward(p, f"#{p.answer}{obs}#1") == 0.0  # an answer before the call does not count
    assert task.reward(p, None) == 0.0 and task.reward(p, "#" + "9" * 40) == 0.0


@pytest.mark.parametrize("code", ["print(123*45)", "print(9999 * 1234)", "print(7*0)"])
def test_warm_start_sandbox_agrees_with_the_process_sandbox(code):
    real = ProcessSandbox(SandboxConfig(isolation=best_isolation())).run(code)
    simulated = simulate_product_program(code)
    assert render_result(simulated) == render_result(real) and simulated.status == real.status == "ok"


@pytest.mark.parametrize("code", ["print(1+2)", "import os", "print(x*2)", "print(2**10)", "print(1*2", "print('a'*2)"])
def test_warm_start_sandbox_refuses_other_programs(code):
    result = simulate_product_program(code)
    assert result.status == "error" and render_result(result).startswith("error: SimulationError")


def test_sft_masks_the_observation_and_keeps_answer_and_eos(task):
    from stare.data.tasks.tool_arithmetic import ALPHABET
    from stare.models.tiny import _sft_batch, build_tokenizer

    tok = build_tokenizer([ALPHABET], whole_tokens=task.whole_tokens)
    p = task.problems("train", 1, 0)[0]
    ids, mask, labels = _sft_batch(tok, task, [p])
    prompt = tok.encode(p.prompt, add_special_tokens=False)
    call, obs, answer = (tok.encode(t, add_special_tokens=False) for t, _ in task.solution_segments(p))
    assert ids[0].tolist() == prompt + call + obs + answer + [tok.eos_token_id]
    expected = [-100] * len(prompt) + call + [-100] * len(obs) + answer + [tok.eos_token_id]
    assert labels[0].tolist() == expected and mask[0].tolist() == [1] * len(expected)
    assert tok.decode(call + obs + answer, skip_special_tokens=True) == task.solution(
        p
    )  # whole tokens decode as written
    assert len(call) == 1 + 1 + len(f"print({p.prompt[:-1]})") + 3 + 1  # tags and JSON head are one token each


def test_only_tasks_with_a_build_version_add_it_to_the_cache_key():
    import dataclasses
    import hashlib
    import json

    from stare.models.tiny import BUILD_VERSION, TinyModelSpec

    def plain(spec):  # the key as computed before tasks had build versions
        blob = json.dumps({"version": BUILD_VERSION, **dataclasses.asdict(spec)}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    assert TinyModelSpec().args_hash() == plain(TinyModelSpec())  # arithmetic: unchanged
    tool = TinyModelSpec(task_name="tool-arithmetic")
    assert tool.args_hash() != plain(tool)  # tool-arithmetic: its build_version is part of the key
