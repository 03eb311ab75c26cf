"""The bundled arithmetic task: determinism, splits, the verifier, the registry."""

import random

import pytest

from stare.data.tasks import TASKS, Problem, SupervisedTask, Task, build_task
from stare.data.tasks.arithmetic import ALPHABET, LEVELS, ArithmeticTask


def test_registry_builds_arithmetic():
    task = build_task("arithmetic")
    assert isinstance(task, ArithmeticTask)
    assert isinstance(task, Task) and isinstance(task, SupervisedTask)
    assert "arithmetic" in TASKS


def test_unknown_task_error_lists_valid_names():
    with pytest.raises(ValueError) as err:
        build_task("no-such-task")
    for name in TASKS:
        assert name in str(err.value)


def test_problems_are_deterministic_from_the_seed():
    task = ArithmeticTask()
    assert task.problems("train", 50, seed=3) == ArithmeticTask().problems("train", 50, seed=3)


def test_different_seeds_give_different_problems():
    task = ArithmeticTask()
    a = [p.prompt for p in task.problems("train", 50, seed=0)]
    b = [p.prompt for p in task.problems("train", 50, seed=1)]
    assert a != b


def test_a_longer_draw_extends_a_shorter_one():
    task = ArithmeticTask()
    assert task.problems("test", 80, seed=5)[:30] == task.problems("test", 30, seed=5)


def test_train_and_test_splits_are_disjoint():
    task = ArithmeticTask()
    train = {p.prompt for s in range(3) for p in task.problems("train", 2000, seed=s)}
    test = {p.prompt for s in range(3) for p in task.problems("test", 2000, seed=s)}
    assert train and test and not train & test


def test_levels_rotate_and_match_their_shape():
    task = ArithmeticTask(levels=(1, 3, 4))
    problems = task.problems("train", 300, seed=0)
    assert [p.level for p in problems[:6]] == [1, 3, 4, 1, 3, 4]
    for p in problems:
        n_operands, top = LEVELS[p.level]
        body = p.prompt.removesuffix("=")
        numbers = [int(x) for x in body.replace("+", " ").replace("-", " ").replace("*", " ").split()]
        assert len(numbers) == n_operands and max(numbers) <= top
        assert body.count("*") <= 1


def test_prompts_are_distinct_while_the_split_allows():
    problems = ArithmeticTask(levels=(2,)).problems("test", 200, seed=0)
    assert len({p.prompt for p in problems}) == 200


def test_a_small_level_repeats_once_exhausted():
    # Level 1 has 10 * 10 * 3 expressions in all, about a fifth of them in the test split.
    problems = ArithmeticTask(levels=(1,)).problems("test", 200, seed=0)
    assert 40 <= len({p.prompt for p in problems}) < 100


def test_problem_id_is_derived_from_the_prompt():
    task = ArithmeticTask()
    by_prompt = {}
    for p in task.problems("train", 3000, seed=0):
        assert by_prompt.setdefault(p.prompt, p.problem_id) == p.problem_id
    assert len(set(by_prompt.values())) == len(by_prompt)


def test_problem_is_frozen():
    p = ArithmeticTask().problems("train", 1, seed=0)[0]
    with pytest.raises(AttributeError):
        p.answer = "0"


@pytest.mark.parametrize(
    ("prompt", "answer", "solution"),
    [
        ("3+5*2=", "13", "5*2=10;3+10=13;#13"),  # '*' first
        ("3+5*2-4=", "9", "5*2=10;3+10=13;13-4=9;#9"),
        ("6-9=", "-3", "6-9=-3;#-3"),
        ("0-8-4*5=", "-28", "4*5=20;0-8=-8;-8-20=-28;#-28"),  # left to right after '*'
        ("17-3+19=", "33", "17-3=14;14+19=33;#33"),
    ],
)
def test_reference_solution_by_hand(prompt, answer, solution):
    task = ArithmeticTask()
    p = task._problem(prompt, level=2)
    assert p.answer == answer
    assert task.solution(p) == solution


def test_every_solution_is_rewarded_and_uses_the_alphabet():
    task = ArithmeticTask()
    rng = random.Random(0)
    for p in task.problems("train", 400, seed=0):
        for text in (task.solution(p), task.solution(p, rng)):
            assert task.reward(p, text) == 1.0
            assert set(p.prompt + text) <= set(ALPHABET)


def test_solution_variants_swap_only_commutative_operands():
    task = ArithmeticTask()
    p = task._problem("3+5*2-4=", level=4)
    variants = {task.solution(p, random.Random(s)) for s in range(40)}
    # '5*2' and '3+10' may each be swapped; '13-4' may not.
    assert variants == {
        "5*2=10;3+10=13;13-4=9;#9",
        "2*5=10;3+10=13;13-4=9;#9",
        "5*2=10;10+3=13;13-4=9;#9",
        "2*5=10;10+3=13;13-4=9;#9",
    }


@pytest.mark.parametrize(
    ("completion", "reward"),
    [
        ("5*2=10;3+10=13;#13", 1.0),
        ("#13", 1.0),  # only the final answer is graded
        ("#013", 1.0),  # canonicalised
        ("5*2=10;3+10=13;#13<eos>", 1.0),
        ("5*2=10;3+10=14;#14", 0.0),
        ("#-13", 0.0),
        ("#12#13", 0.0),  # the first '#' counts
        ("5*2=10;3+10=13;", 0.0),  # no final answer
        ("", 0.0),
        ("#", 0.0),
        ("##--**;;", 0.0),
        ("#" + "9" * 5000, 0.0),  # absurdly long digit run
        ("\x00\uffff#\u0663", 0.0),  # non-ASCII digit after '#'
    ],
)
def test_reward(completion, reward):
    task = ArithmeticTask()
    problem = task._problem("3+5*2=", level=2)
    assert task.reward(problem, completion) == reward


def test_reward_never_raises_on_non_strings():
    task = ArithmeticTask()
    problem = task._problem("3+5*2=", level=2)
    for junk in (None, 13, b"#13", ["#13"]):
        assert task.reward(problem, junk) == 0.0


def test_extract_answer():
    task = ArithmeticTask()
    assert task.extract_answer("1+1=2;#2") == "2"
    assert task.extract_answer("#-0") == "0"
    assert task.extract_answer("no answer") is None
    assert task.extract_answer("#\u0663") is None  # ASCII digits only


def test_invalid_arguments_are_rejected():
    with pytest.raises(ValueError, match="levels"):
        ArithmeticTask(levels=(1, 9))
    with pytest.raises(ValueError, match="split"):
        ArithmeticTask().problems("validation", 1, seed=0)
    with pytest.raises(ValueError, match="n must be"):
        ArithmeticTask().problems("train", -1, seed=0)


def test_problem_fields():
    p = ArithmeticTask().problems("train", 1, seed=0)[0]
    assert isinstance(p, Problem)
    assert p.data_source == "stare/arithmetic" and p.level == 1 and p.problem_id.startswith("arithmetic-L1-")
