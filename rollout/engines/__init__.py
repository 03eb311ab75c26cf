"""Rollout engines: the protocol (`base.py`), the transformers engine (`hf_engine.py`), vLLM
(`vllm_engine.py`, its arguments in `vllm_args.py`) and their registry (`registry.py`: one entry per
engine, its class and its config section)."""
