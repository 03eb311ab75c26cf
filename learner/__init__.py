"""The learner role: STARE (and its baselines) trained with DeepSpeed on scored trajectories.

Its rooms, each importing only the ones below it (an import-linter contract in pyproject.toml):

- `process/`: the `stare learner` process (its seams over Redis, several ranks, the colocated node).
- `loop/`: THE training loop of both modes (`TrainingSession`), complete groups, evaluation through
  the streams, how a run ended.
- `step/`: one optimizer step on the device: batch layout, micro-batches, the pre-pass and the
  training pass, several updates per batch.
- `engine/`: the model on its device: DeepSpeed, collectives, LoRA, checkpoints and export, RNG states.
- `algorithm/`: pure tensor functions: advantages, top-k selection, the surrogate, the losses and
  their registry, the per-step plan, the entropy controller, rollout correction, diagnostics.
"""
