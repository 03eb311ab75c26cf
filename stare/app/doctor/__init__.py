"""`stare doctor`: is this node able to run stare? The first thing to run on a GPU node.

A registry of checks (`registry.py`), one module per group under `checks/`: environment, topology,
engine, weights, learner, config. Each group runs in a process of its own with a time limit
(`runner.py`), so a hanging check (an NCCL op that never completes) fails its rows instead of hanging
the doctor. The report is a table on stdout and a JSON file (`report.py`, schema-checked), which a bug
report attaches.

Each GPU check has a CPU equivalent that runs everywhere (gloo for NCCL, the transformers engine for
vLLM, a fake stream device for CUDA streams); on a machine without a GPU, or without vLLM, the GPU
checks are skipped with the reason.
"""
