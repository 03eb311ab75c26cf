"""Format reward: does the response have the required tags, well formed and in order?

`format_reward(response, config)` checks each tag in `required_tags` (default `<think>` then
`<answer>`): it opens and closes (`<t>...</t>`, opening first), appears exactly once when
`exactly_once`, the tags follow one another in the listed order without overlapping when
`in_order`, and nothing but whitespace follows the last closing tag when `nothing_after`. With
`prefix` (e.g. "<think>" when the chat template already opened the tag) the checks see
`prefix + response`. All checks pass: 1.0; else 0.0, or with `partial_credit` the fraction of
tags that are well formed (order and trailing text then count as one more check each).

Not covered: what is inside the tags (the math/code verifiers judge that), nested or attribute-
carrying tags (`<answer id=1>` does not count as `<answer>`).
"""

from __future__ import annotations

import re

from reward.verifiers.registry import register_verifier
from stare.config.reward import FormatConfig


def _span(text: str, tag: str, exactly_once: bool) -> tuple[int, int] | None:
    """(start of <tag>, end of </tag>) if the tag is well formed, else None."""
    opens = [m.start() for m in re.finditer(re.escape(f"<{tag}>"), text)]
    closes = [m.end() for m in re.finditer(re.escape(f"</{tag}>"), text)]
    if not opens or not closes:
        return None
    if exactly_once and (len(opens) != 1 or len(closes) != 1):
        return None
    if closes[0] - len(f"</{tag}>") < opens[0] + len(f"<{tag}>"):
        return None
    return opens[0], closes[0]


def format_reward(response: str, config: FormatConfig | None = None) -> float:
    """1.0 if `response` satisfies every check of `config`, else 0.0 (or the fraction passed)."""
    config = config or FormatConfig()
    text = config.prefix + response
    spans = [_span(text, tag, config.exactly_once) for tag in config.required_tags]
    checks = [span is not None for span in spans]
    found = [span for span in spans if span is not None]
    if config.in_order:
        checks.append(len(found) == len(spans) and all(a[1] <= b[0] for a, b in zip(found, found[1:])))
    if config.nothing_after:
        checks.append(bool(found) and text[max(end for _, end in found) :].strip() == "")
    if config.partial_credit:
        return sum(checks) / len(checks)
    return 1.0 if all(checks) else 0.0


@register_verifier("format")
def score_format(c, x, context) -> float:
    return format_reward(x.response, c.config)
