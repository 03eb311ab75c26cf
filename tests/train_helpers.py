"""Shared by the tests that train: the overrides of a fast embedded run."""

from __future__ import annotations


def fast_override_list(model_dir, out_dir) -> list[str]:
    """Config overrides for a fast embedded run of the tiny test model under `out_dir`."""
    return [
        f"model.path={model_dir}",
        f"run.output_dir={out_dir}",
        "run.name=t",
        "run.steps=2",
        "run.checkpoint_every=1",
        "run.threads=1",
        "task.eval_problems=8",
        "task.eval_every=100",
        "task.eval_k=2",
        "rollout.prompts_per_step=2",
        "rollout.samples_per_prompt=4",
        "rollout.max_new_tokens=16",
        "optim.micro_batch=4",
        "data.max_sampling_rounds=2",
        "data.dynamic_sampling=false",
    ]
