"""How a session that trained nothing ends (learner/loop/run_outcome.py): the rule that refused the input,
the measured fraction of equal-reward groups."""

from learner.loop.run_outcome import MAX_EMPTY_STEPS, EmptySteps, RunOutcome, rule_of

REASON = (
    "prompt has 40 tokens, over the limit of 3 (data.max_prompt_len, ...); data.prompt_overflow=reject parks "
    "it here (admit it with data.prompt_overflow=truncate_left, or raise that limit)"
)


def test_a_step_whose_groups_were_all_dead_lettered_stops_at_once_naming_the_rule():
    empty = EmptySteps()
    assert empty.add(filtered=0, dead=2, reasons=[REASON, REASON.replace("40", "41")]) == "no_input"
    message = empty.message("no_input")
    assert "all 2 groups of the last 1 step(s) were dead-lettered" in message
    assert "2 entries refused; 2 by: " + REASON in message  # one rule: the numbers differ, the rule does not


def test_no_signal_names_the_measured_fraction_of_equal_reward_groups_after_the_streak():
    empty = EmptySteps()
    outcomes = [empty.add(filtered=3, dead=0, reasons=[]) for _ in range(MAX_EMPTY_STEPS - 1)]
    outcomes.append(empty.add(filtered=1, dead=1, reasons=["x 1"]))
    assert outcomes[:-1] == [None] * (MAX_EMPTY_STEPS - 1) and outcomes[-1] == "no_signal"
    # 3 x 19 + 1 = 58 equal-reward groups of 58 + 1 = 59 closed: 98%
    assert f"no reward signal for {MAX_EMPTY_STEPS} steps in a row: 98% of the 59 groups" in empty.message("no_signal")


def test_only_the_two_empty_outcomes_are_failures():
    assert [RunOutcome(o, 0).failed for o in ("finished", "stopped", "no_input", "no_signal")] == [
        False,
        False,
        True,
        True,
    ]
    assert rule_of("over 40 of 3") == "over N of N"
