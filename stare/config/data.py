"""What a run trains on: the training prompts (their pool, epochs, length policy), dynamic sampling and the
advantages' normalisation (the `data` section of the run config)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from stare.config.base import _Section


class DataSection(_Section):
    max_prompt_len: int | None = Field(
        None,
        ge=1,
        description="Longest prompt in tokens. Applied when the problems load (train and held-out: "
        "counted and named in the log) and again by each rollout worker, whose limit is also what the engine's "
        "max_model_len leaves after rollout.max_new_tokens. None: only the engine's limit.",
    )
    prompt_overflow: Literal["truncate_left", "reject"] = Field(
        "truncate_left",
        description="A prompt over the limit: truncate_left keeps its last tokens (verl's "
        "truncation='left', the reference run's setting); reject drops the problem at load time, and at a rollout "
        "worker sends the prompt to the prompts dead-letter stream with the reason. Never crashes a worker.",
    )
    dynamic_sampling: bool = Field(True, description="Drop groups whose rewards are all equal and sample more.")
    max_sampling_rounds: int = Field(
        10, ge=1, description="Rounds of sampling per step when dynamic sampling drops groups."
    )
    oversample: float = Field(
        1.0,
        ge=1.0,
        le=10.0,
        description="Groups sampled per group trained, to cover what dynamic sampling filters "
        "(the reference's generation batch: 192 prompts for 64 trained is 3.0). On-policy (max_staleness 0) each "
        "sampling round publishes ceil(missing x oversample) groups (a later round of the step also divided by the "
        "step's yield so far), the step waits for the whole round and trains "
        "the first rollout.prompts_per_step trainable groups in publish order (not the first to finish: those are "
        "the short responses); the rest are dropped, counted in surplus_groups_total. Off-policy the window of "
        "groups in flight is ceil(prompts_per_step x (1 + max_staleness) x oversample); nothing is dropped as "
        "surplus (a group past max_staleness is dropped as stale, counted). 1.0: each round asks for exactly the "
        "missing groups and the window is prompts_per_step x (1 + max_staleness).",
    )
    max_prompts: int | None = Field(
        None,
        ge=1,
        description="Training prompts in the pool the feeder cycles through. None: every training problem of a task "
        "read from a file (task.name=dataset: the whole dataset, however large), and 20,000 drawn from a generated "
        "task (the bundled arithmetic tasks, which have no fixed size). A dataset larger than this is cut to its "
        "first max_prompts in the run's seeded order, said in the log (verl's data.train_max_samples).",
    )
    epochs: int | None = Field(
        None,
        ge=1,
        le=100_000,
        description="Passes over the training prompts (verl's trainer.total_epochs; not optim.epochs, the passes of "
        "the optimizer over one batch): the feeder hands out at most epochs x pool prompts, each epoch in its own "
        "seeded order, and the run ends when they are used up and no whole step can be filled (the rest counted in "
        "the log, as verl drops a last partial batch). With run.steps null the run's length is derived from it. "
        "None: the pool is cycled without end and run.steps decides.",
    )
    advantage_std: bool = Field(
        True, description="Divide group-centred rewards by the group std (False: Dr. GRPO style)."
    )
