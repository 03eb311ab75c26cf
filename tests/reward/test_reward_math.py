"""Math verifier: real-world answer pairs that are (and are not) equivalent, and extraction."""

import threading

import pytest

from stare.data.tasks.math_verify import MathConfig, VerifierTimeout, check_math, extract_answer, math_reward


@pytest.mark.parametrize(
    "response,gold",
    [
        (r"So the answer is \boxed{\frac{1}{2}}.", "0.5"),
        (r"\boxed{0.5}", r"\frac{1}{2}"),
        (r"\boxed{\dfrac{1}{2}}", r"\frac12"),
        (r"<answer>x=3</answer>", "3"),
        ("Answer: 1,000", "1000"),
        (r"\boxed{1{,}000}", "1000"),
        (r"\boxed{[1,2)}", "[1,2)"),
        (r"\boxed{(-\infty, 2]}", r"(-\infty,2]"),
        (r"\boxed{\{2,1\}}", r"\{1,2\}"),
        (r"\boxed{3, 2}", "2, 3"),
        (r"Answer: $\frac{\sqrt{2}}{2}$", r"\frac{1}{\sqrt2}"),
        (r"\boxed{50\%}", "0.5"),
        (r"\boxed{12.0}", "12"),
        (r"\boxed{x^2+2x+1}", "(x+1)^2"),
        (r"\boxed{\text{(B)}}", "B"),
        ("<answer>The answer is 5 apples</answer>", "5"),
        (r"\boxed{2^{2^{3}}}", "256"),
    ],
    ids=lambda v: v if len(v) < 30 else v[:30],
)
def test_equivalent_answers_are_correct(response, gold):
    assert math_reward(response, gold) == 1.0


@pytest.mark.parametrize(
    "response,gold",
    [
        (r"\boxed{-3}", "3"),  # wrong sign
        (r"\boxed{(1,2]}", "[1,2)"),  # other interval ends
        (r"\boxed{1/3}", "0.333"),  # rounded too early
        (r"\boxed{y^2+2y+1}", "(x+1)^2"),  # other variable (strict mode)
        (r"\boxed{\{1,2,3\}}", r"\{1,2\}"),  # extra element
        (r"\boxed{100}", "1000"),
        (r"\boxed{\frac{2}{1}}", r"\frac{1}{2}"),  # inverted
    ],
    ids=lambda v: v if len(v) < 30 else v[:30],
)
def test_different_answers_are_wrong(response, gold):
    assert math_reward(response, gold) == 0.0


def test_last_boxed_answer_counts():
    assert math_reward(r"First \boxed{2}, then corrected: \boxed{4}", "4") == 1.0


def test_nested_braces_in_boxed_are_balanced():
    assert extract_answer(r"\boxed{\frac{1}{\sqrt{2}}} done", ("boxed",)) == r"\frac{1}{\sqrt{2}}"


def test_answer_tag_is_used_when_there_is_no_boxed():
    assert extract_answer("<think>maybe 3</think><answer> 7 </answer>", ("boxed", "answer_tag")) == "7"


def test_answer_line_takes_the_last_one():
    text = "Answer: 3\nWait, recheck.\nFinal answer: 5."
    assert extract_answer(text, ("answer_line",)) == "5"


def test_unanchored_number_is_not_an_answer_by_default():
    check = check_math("I think it is 7", "7")
    assert (check.correct, check.extracted) == (False, None)


def test_anywhere_source_accepts_an_unanchored_answer():
    assert math_reward("the result is 7", "7", MathConfig(extract_from=("anywhere",))) == 1.0


def test_giant_integer_answer_is_rejected_without_evaluation():
    check = check_math(r"\boxed{10^{10^{10}}}", "1")
    assert not check.correct and "giant integer" in check.reason


def test_unparsable_gold_is_a_data_error():
    with pytest.raises(ValueError, match="gold answer"):
        check_math(r"\boxed{1}", "")


def test_check_works_off_the_main_thread():
    out = []
    thread = threading.Thread(target=lambda: out.append(math_reward(r"\boxed{\frac{1}{2}}", "0.5")))
    thread.start()
    thread.join()
    assert out == [1.0]


def test_timeout_fires_off_the_main_thread(monkeypatch):
    import stare.data.tasks.math_verify as m

    def slow(*_):
        while True:
            pass

    monkeypatch.setattr(m, "_check", slow)
    out = []

    def run():
        try:
            check_math(r"\boxed{1}", "1", MathConfig(timeout_s=0.2))
        except VerifierTimeout as exc:
            out.append(str(exc))

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(5)
    assert out == ["timed out after 0.2 s"]
