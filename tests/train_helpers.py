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


def step_trajectories(vocab: int, seed: int = 0) -> list:
    """Two groups of two with rewards 1/0: a non-zero advantage, so a step moves the weights."""
    import numpy as np

    from stare.transport.records import Trajectory

    rng = np.random.default_rng(seed)
    out = []
    for g in range(2):
        for i in range(2):
            n = 5 + i
            out.append(
                Trajectory(
                    run_id="t",
                    trajectory_id=f"g{g}-{i}",
                    group_id=f"g{g}",
                    group_size=2,
                    weight_version=0,
                    prompt_token_ids=rng.integers(3, vocab, 4).astype(np.int32),
                    response_token_ids=rng.integers(3, vocab, n).astype(np.int32),
                    response_logprobs=np.full(n, -1.0, np.float32),
                    loss_mask=np.ones(n, np.uint8),
                    finish_reason="length",
                    answer="1",
                    problem_id=f"p{g}",
                    data_source="t",
                    reward=float(i == 0),
                )
            )
    return out
