"""Math answer verifier: is the model's final answer equivalent to the reference answer?

Extraction takes the model's final answer from, in `MathConfig.extract_from` order: the last
`\\boxed{...}` / `\\fbox{...}`, the last `<answer>...</answer>`, the last "Answer: ..." line, or
(opt-in) anywhere in the response via math-verify's own heuristics. Equivalence is math-verify's
(`parse` + `verify`, HuggingFace): LaTeX (`\\frac`, `\\dfrac`, `\\sqrt`, `\\pi`, `\\text{}`
units), plain expressions, decimals vs fractions, thousands separators (`1,000`), percentages,
equations against values (`x=3` vs `3`), intervals, sets and comma lists (order-free).

Timeouts: math-verify's own timeout is `signal.alarm`, which raises in any thread but the main
one, so we call it with its timeouts off and bound the whole check with
`timeouts.call_with_timeout`, which works on any thread. That interrupts Python code only; a huge
integer computed in C (`2^{2^{40}}`) runs until it ends: use `ScoringPool` for a hard bound.

Not covered: answers that need reading comprehension (units in words, "none of the above"),
multiple-choice letters (math-verify's `StringExtractionConfig` would be needed), proofs.
Functions here are pure apart from that timer thread; nothing is imported until first use
(math-verify's import takes ~1 s).
"""

from __future__ import annotations

import functools
import math as _stdmath  # absolute import: the standard library, not this module
import re
from typing import Any

from pydantic import BaseModel, ConfigDict

from stare.config.reward import AnswerSource, MathConfig
from stare.runtime.timeouts import VerifierTimeout, call_with_timeout

_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL | re.IGNORECASE)
_ANSWER_LINE = re.compile(r"^[ \t*#>_-]*(?:final\s+)?answer\s*[:：][ \t]*(.+?)[ \t]*$", re.IGNORECASE | re.MULTILINE)
_BOXED = re.compile(r"\\(?:boxed|fbox)\s*\{")
# Numeric power towers, huge exponents and big factorials make sympy build giant integers in C,
# where no in-thread timeout can reach; such answers are judged wrong without being parsed.
_TOWER = re.compile(r"(?:\^|\*\*)\s*[{(]?\s*(\d+)\s*(?:\^|\*\*)\s*[{(]?\s*(\d+)")
_BIG_EXPONENT = re.compile(r"(?:\^|\*\*)\s*[{(]?\s*\d{7,}")  # an exponent >= 10^6
_BIG_FACTORIAL = re.compile(r"\d{6,}\s*!")  # n! with n >= 10^5


def _too_big(answer: str) -> bool:
    """Whether evaluating `answer` would build an integer of more than ~a million digits."""
    if _BIG_EXPONENT.search(answer) or _BIG_FACTORIAL.search(answer):
        return True
    for base, exponent in _TOWER.findall(answer):  # a^{b^c}: b^c must stay below 10^6
        if int(base) > 1 and len(exponent) < 7 and int(exponent) * _stdmath.log10(int(base)) > 6:
            return True
        if int(base) > 1 and len(exponent) >= 7:
            return True
    return False


class MathCheck(BaseModel):
    """One verdict: `correct`, the answer text that was judged, and why it failed if it did."""

    model_config = ConfigDict(frozen=True)

    correct: bool
    extracted: str | None = None
    reason: str | None = None


def _last_boxed(text: str) -> str | None:
    """Content of the last \\boxed{...} or \\fbox{...}, with nested braces balanced."""
    matches = list(_BOXED.finditer(text))
    for match in reversed(matches):
        depth, start = 1, match.end()
        for i in range(start, len(text)):
            if text[i] == "{":
                depth += 1
            elif text[i] == "}":
                depth -= 1
                if depth == 0:
                    return text[start:i].strip()
    return None


def extract_answer(response: str, sources: tuple[AnswerSource, ...]) -> str | None:
    """The final answer text from `response`, from the first source (in order) that has one."""
    for source in sources:
        found: str | None = None
        if source == "boxed":
            found = _last_boxed(response)
        elif source == "answer_tag":
            tags = _ANSWER_TAG.findall(response)
            found = tags[-1].strip() if tags else None
            if found is not None:
                found = _last_boxed(found) or found
        elif source == "answer_line":
            lines = _ANSWER_LINE.findall(response)
            found = lines[-1].strip().rstrip(".") if lines else None
            if found is not None:
                found = _last_boxed(found) or found
        elif source == "anywhere":
            found = response.strip()
        if found:
            return found
    return None


def _parse(text: str, whole_response: bool = False) -> list[Any]:
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse

    targets = [LatexExtractionConfig(boxed_match_priority=0), ExprExtractionConfig()]
    parsed: list[Any]  # sympy expressions and strings (math-verify is untyped)
    if whole_response or "$" in text or "\\boxed" in text or "\\(" in text:
        parsed = parse(text, targets, parsing_timeout=None)
        return parsed
    # A bare answer: read it as LaTeX math first ("\{1,2\}", "[1,2)", "x=3"), else as text.
    parsed = parse(f"${text}$", targets, parsing_timeout=None) or parse(text, targets, parsing_timeout=None)
    return parsed


def _silence_timeout_warning() -> None:
    """math-verify warns once that its timeout is off; ours is on (see the module docstring)."""
    import math_verify.grader
    import math_verify.parser

    for module in (math_verify.grader, math_verify.parser):
        if hasattr(module, "TIMEOUT_WARNING_SHOWN"):
            module.TIMEOUT_WARNING_SHOWN = True


def _check(response: str, gold: str, config: MathConfig) -> MathCheck:
    from math_verify import verify

    _silence_timeout_warning()
    extracted = extract_answer(response, config.extract_from)
    if extracted is None:
        return MathCheck(correct=False, reason=f"no answer found in {list(config.extract_from)}")
    if len(extracted) > config.max_answer_chars:
        return MathCheck(
            correct=False,
            extracted=extracted[:80] + "...",
            reason=f"answer longer than max_answer_chars={config.max_answer_chars}",
        )
    if _too_big(extracted):
        return MathCheck(
            correct=False, extracted=extracted, reason="answer would evaluate to a giant integer (not evaluated)"
        )
    gold_parsed = _parse(gold)
    if not gold_parsed:
        raise ValueError(f"gold answer {gold!r} could not be parsed; fix the data set entry")
    pred_parsed = _parse(extracted, whole_response="anywhere" in config.extract_from and extracted == response.strip())
    if not pred_parsed:
        return MathCheck(correct=False, extracted=extracted, reason="answer could not be parsed")
    correct = verify(
        gold_parsed, pred_parsed, float_rounding=config.float_rounding, strict=config.strict, timeout_seconds=None
    )
    return MathCheck(
        correct=bool(correct), extracted=extracted, reason=None if correct else "not equivalent to the reference"
    )


@functools.cache
def warm_up() -> None:
    """Import sympy and build math-verify's LaTeX parser once, outside any timeout: that cold
    start takes seconds (more on a busy machine) and must not be charged to the first answer."""
    from math_verify import verify

    _silence_timeout_warning()
    verify(_parse("\\frac{1}{2}"), _parse("0.5"), timeout_seconds=None)


def check_math(response: str, gold: str, config: MathConfig | None = None) -> MathCheck:
    """Judge `response` against the reference answer `gold` (LaTeX or plain, no `$` needed).

    Raises `VerifierTimeout` past `config.timeout_s` and `ValueError` for an unparsable `gold`
    (a data problem, not the model's); a wrong or missing answer is a normal `MathCheck`.
    """
    config = config or MathConfig()
    warm_up()
    return call_with_timeout(_check, config.timeout_s, response, gold, config)


def math_reward(response: str, gold: str, config: MathConfig | None = None) -> float:
    """1.0 if the final answer in `response` is equivalent to `gold`, else 0.0 (see check_math)."""
    return 1.0 if check_math(response, gold, config).correct else 0.0


__all__ = ["MathCheck", "MathConfig", "VerifierTimeout", "check_math", "extract_answer", "math_reward"]
