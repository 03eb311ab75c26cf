"""Warnings about a run that trains but cannot learn, said in the log and kept as step metrics.

    watch = RunWatch(cfg.logging, unk_id=tokenizer.unk_token_id, say=log.warning)
    metrics.update(watch.step(step, trajectories))          # once per optimizer step, host records only

What it looks at, per step, over the trained batch (numbers on the host records: no device read):
    unk_rate_prompt, unk_rate_response  the share of prompt / response tokens that are the tokenizer's unknown
                                        token (a tokenizer that does not cover the data: the character-level
                                        tiny model fed chat text sees `<unk>` everywhere); warned once a run above
                                        logging.warn_unk_rate. A tokenizer without an unknown token (byte-level
                                        BPE): no check, no metric.
    equal_reward_groups                 trained groups whose rewards are all equal: zero advantages, they move
                                        nothing (possible only with data.dynamic_sampling off, which keeps them);
                                        warned on the first step where every group is so, and every WARN_EVERY
                                        steps while it lasts.
    zero_reward_steps                   steps in a row whose mean reward is 0; warned when it reaches
                                        logging.warn_zero_reward_steps and every that many steps after.

The training prompts are measured once when the feeder is built (`prompt_coverage`, called by
stare.data.feeder.check_coverage; also the unknown characters a tokenizer drops instead of mapping them to its
unknown token): data_unk_rate and data_chars_lost in every step's metrics.
The streaks start at 0 in a resumed process: they are warnings, not state of the run.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import numpy as np

WARN_EVERY = 10  # steps between two reminders of a condition that lasts
UNK_SAMPLE = 1000  # training prompts tokenized to measure the unknown-token share at start


class _Scored(Protocol):
    group_id: str
    reward: float
    prompt_token_ids: Any
    response_token_ids: Any


def unk_share(token_ids: Sequence[Any], unk_id: int) -> float:
    """The share of `unk_id` among every token of `token_ids` (sequences of ids; 0 when there are none)."""
    total = sum(len(t) for t in token_ids)
    if not total:
        return 0.0
    return sum(int(np.count_nonzero(np.asarray(t) == unk_id)) for t in token_ids) / total


def prompt_coverage(texts: Sequence[str], tokenizer: Any) -> dict[str, float]:
    """How well `tokenizer` covers these prompt texts: `unk_rate`, the share of their tokens that are its
    unknown token (0 without one), and `chars_lost`, the share of their non-space characters that do not come
    back from decode(encode(text)): what a tokenizer maps to its unknown token or silently drops (a
    character-level vocabulary loaded as another tokenizer class drops what it does not know)."""
    ids = [tokenizer.encode(t, add_special_tokens=False) for t in texts]
    unk_id = getattr(tokenizer, "unk_token_id", None)
    chars = sum(len("".join(t.split())) for t in texts)
    kept = sum(len("".join(tokenizer.decode(i, skip_special_tokens=True).split())) for i in ids)
    return {
        "unk_rate": 0.0 if unk_id is None else unk_share(ids, unk_id),
        "chars_lost": max(chars - kept, 0) / chars if chars else 0.0,
    }


COVERAGE_ADVICE = (
    "the model's tokenizer does not cover this data (the bundled tiny model knows only the arithmetic alphabet); "
    "train a model whose tokenizer does (model.path), or data it covers"
)


def unk_advice(rate: float, what: str, unk_token: str) -> str:
    return f"{rate:.0%} of the {what} tokens are the tokenizer's unknown token {unk_token!r}: {COVERAGE_ADVICE}"


class RunWatch:
    def __init__(self, logging_cfg: Any, *, unk_id: int | None, unk_token: str = "<unk>", say: Callable[[str], None]):
        self.max_unk: float = logging_cfg.warn_unk_rate
        self.zero_after: int = logging_cfg.warn_zero_reward_steps
        self.unk_id, self.unk_token, self.say = unk_id, unk_token, say
        self.zero_streak = 0  # steps in a row with mean reward 0
        self.equal_streak = 0  # steps in a row where every group's rewards are equal
        self._unk_warned = False

    @classmethod
    def of(cls, logging_cfg: Any, tokenizer: Any, say: Callable[[str], None]) -> RunWatch:
        """The watch of a run whose prompts and responses are `tokenizer`'s ids (None: no unknown-token check)."""
        unk_token = getattr(tokenizer, "unk_token", None) or "<unk>"
        return cls(logging_cfg, unk_id=getattr(tokenizer, "unk_token_id", None), unk_token=unk_token, say=say)

    def step(self, step: int, trajectories: Sequence[_Scored]) -> dict[str, Any]:
        """The step's watch metrics; says a warning when one applies."""
        out: dict[str, Any] = {}
        if self.unk_id is not None and trajectories:
            out["unk_rate_prompt"] = unk_share([t.prompt_token_ids for t in trajectories], self.unk_id)
            out["unk_rate_response"] = unk_share([t.response_token_ids for t in trajectories], self.unk_id)
            what, rate = max(("prompt", out["unk_rate_prompt"]), ("response", out["unk_rate_response"]), key=_second)
            if rate > self.max_unk and not self._unk_warned:
                self._unk_warned = True
                self.say(
                    f"warning: step {step}: {unk_advice(rate, what, self.unk_token)} "
                    f"(logging.warn_unk_rate={self.max_unk})"
                )
        rewards: dict[str, list[float]] = defaultdict(list)
        for t in trajectories:
            rewards[t.group_id].append(float(t.reward))
        equal = sum(max(r) == min(r) for r in rewards.values())
        out["equal_reward_groups"] = equal
        if rewards and equal == len(rewards):
            self.equal_streak += 1
            if self.equal_streak % WARN_EVERY == 1:
                self.say(
                    f"warning: step {step}: every group's rewards are equal ({len(rewards)} groups"
                    + (f", {self.equal_streak} steps in a row" if self.equal_streak > 1 else "")
                    + "): the advantages are zero everywhere and the step learns nothing; turn "
                    "data.dynamic_sampling on (it drops such groups and samples more), or check the reward"
                )
        else:
            self.equal_streak = 0
        mean = sum(float(t.reward) for t in trajectories) / len(trajectories) if trajectories else None
        self.zero_streak = self.zero_streak + 1 if mean == 0.0 else 0
        out["zero_reward_steps"] = self.zero_streak
        n = self.zero_after
        if n and self.zero_streak >= n and (self.zero_streak - n) % n == 0:
            self.say(
                f"warning: step {step}: the reward has been 0 for {self.zero_streak} steps in a row: nothing is "
                "learned; read generations.jsonl in the run folder (does the model answer in the form the reward "
                f"reads?) and the reward settings (logging.warn_zero_reward_steps={n})"
            )
        return out


def _second(pair: tuple[str, float]) -> float:
    return pair[1]
