"""Core: what the learner trains on and is judged on.

`tasks/` (the bundled tasks, datasets and their verifiers, the registry), `feeder` (the prompt feeder
and its cursor), `prompt_policy` (one prompt-length policy for training and held-out prompts),
`heldout` (the held-out evaluation plan: problems, seeds, avg@n / pass@n), `prepare` (turning raw
DAPO/AIME/AMC/MATH files into verl parquet; `scripts/prepare_data.py`).
"""
