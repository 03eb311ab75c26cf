"""One optimizer step on the learner's device (`Learner.step` in `trainer.py`): scored trajectories ->
padded batch (`batch.py`) -> this rank's rows and micro-batches (`step_rows.py`, `micro_batches.py`)
-> the no-grad pre-pass and the training pass (`forward_passes.py`, chunked log-probs in
`logprobs.py`) -> one or several optimizer updates (`ppo_updates.py`). Pre-pass values computed
ahead of the step wait in `prepass_store.py`."""
