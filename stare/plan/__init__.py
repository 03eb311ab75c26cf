"""Core: planning a run on GPUs before it starts.

`memory` (`stare plan`: GPU memory per role, does it fit, what to change), `gpu_map` (which GPUs
each role gets: `CUDA_VISIBLE_DEVICES` per role).
"""
