"""Colocation: rollout engines that share GPUs with the learner, sleeping while it steps. Two modes:

- one GPU (`one_gpu.py`, `stare train` with `system.colocate`): the embedded run's engine sleeps
  while the learner steps on the same device;
- the node (`node.py`, `system.colocate: on` under `stare up` / `stare learner`): every learner rank
  hosts an engine; the learner's side is learner/process/colocation.py.

The config checks are stare/config/colocation.py, the memory plan stare/plan/colocation.py."""
