"""Core: what a run writes for people to watch.

`log_format` (step lines and JSON logs), `run_outputs` (the run folder's metrics and TensorBoard
files), `wandb_log` (Weights & Biases), `machine` (the machine fingerprint a result is tied to), `files`
(the run's rewritten files replaced whole, its append-only logs read past a damaged line).
"""
