"""What a memory plan is made of (`stare plan`, stare/plan/gpu_memory.py): items, fixes, a role's plan,
the whole plan, and the limits every role is held to.

A role fits when its total is at most HEADROOM x GPU memory (the rest: CUDA context, NCCL buffers,
allocator fragmentation). These are estimates of the large terms, good to a few GiB, not a promise;
`stare doctor`'s config.plan_peak measures a real step's peak against it on a GPU.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, TypedDict

from stare.config import TrainConfig
from stare.plan.sizes import ModelShape
from stare.plan.weights import checkpoint_disk

GIB = 1 << 30
HEADROOM = 0.9  # fraction of a GPU's memory a role may plan to use
DEFAULT_PROMPT_TOKENS = 1024  # when neither data.max_prompt_len nor --prompt-tokens says
VLLM_PROFILE_TOKENS = 8192  # tokens of the forward pass vLLM profiles (its batched-token budget)
RECEIVE_RESERVE = 1 * GIB  # beside vLLM's share: the rollout process's CUDA context and NCCL's buffers


@dataclass
class Item:
    name: str
    bytes: int
    note: str = ""


@dataclass(frozen=True)
class Fix:
    """One change that helps a role fit: `field` (a config field, or "learner GPUs") to `value`."""

    field: str
    value: Any = None  # None: no single value (the text says what)
    why: str = ""
    relation: str = "="  # "=", ">=" or "<="

    def __str__(self) -> str:
        head = (
            self.field
            if self.value is None
            else f"{self.field}{f' {self.relation} ' if self.relation != '=' else '='}{self.value}"
        )
        return f"{head} ({self.why})" if self.why else head

    @property
    def override(self) -> str | None:
        """The `--set` override for this fix, when it is one config field set to one value."""
        return (
            f"{self.field}={self.value}"
            if self.value is not None and self.relation == "=" and " " not in self.field
            else None
        )


@dataclass
class RolePlan:
    role: str  # learner | rollout
    gpus: int
    gpu_mem_bytes: int
    items: list[Item]
    fits: bool
    fixes: list[Fix] = field(default_factory=list)  # what to change
    notes: list[str] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)
    usable_bytes: int | None = None  # what the role may plan to use; None: HEADROOM x GPU memory
    title: str = ""  # the heading `stare plan` prints (empty: from the role)

    @property
    def total(self) -> int:
        return sum(i.bytes for i in self.items)

    @property
    def usable(self) -> int:
        return int(HEADROOM * self.gpu_mem_bytes) if self.usable_bytes is None else self.usable_bytes


class StageStates(TypedDict):
    """The learner's model states per GPU at one ZeRO stage."""

    bytes: int
    source: str  # how they were counted


@dataclass
class Plan:
    config: str
    model: ModelShape
    dtype: str
    seq_tokens: int
    prompt_tokens: int
    prompt_source: str
    roles: list[RolePlan]
    zero_stages: dict[int, StageStates]  # learner model states per stage
    checkpoint: dict[str, Any] = field(default_factory=dict)  # checkpoint_disk()
    how: list[str] = field(
        default_factory=list
    )  # one GPU, colocated: what sleeps and moves when (stare.plan.colocation)

    @property
    def fits(self) -> bool:
        return all(r.fits for r in self.roles)

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        for role, plan in zip(out["roles"], self.roles):
            role.update(
                total_bytes=plan.total,
                usable_bytes=plan.usable,
                fixes=[{**asdict(f), "text": str(f)} for f in plan.fixes],
            )
        out["fits"] = self.fits
        return out


def _prompt_tokens(cfg: TrainConfig, shape: ModelShape, prompt_tokens: int | None) -> tuple[int, str]:
    if prompt_tokens is not None:
        return prompt_tokens, "--prompt-tokens"
    configured = getattr(cfg.data, "max_prompt_len", None)
    if configured is not None:
        return int(configured), "data.max_prompt_len"
    room = max(shape.max_positions - cfg.rollout.max_new_tokens, 1)
    return min(DEFAULT_PROMPT_TOKENS, room), "assumed: set data.max_prompt_len or pass --prompt-tokens"


def _whole_plan(
    cfg: TrainConfig,
    shape: ModelShape,
    prompt: int,
    source: str,
    roles: list[RolePlan],
    stages: dict[int, StageStates],
    config_name: str,
    how: Sequence[str] = (),
) -> Plan:
    seq = prompt + cfg.rollout.max_new_tokens
    if seq > shape.max_positions:
        for r in roles:
            r.notes.append(f"prompt + response = {seq:,} tokens exceeds the model's {shape.max_positions:,} positions")
    return Plan(
        config=config_name,
        model=shape,
        dtype=cfg.model.dtype,
        seq_tokens=seq,
        prompt_tokens=prompt,
        prompt_source=source,
        roles=roles,
        zero_stages=stages,
        checkpoint=checkpoint_disk(cfg, shape),
        how=list(how),
    )
