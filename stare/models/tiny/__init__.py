"""Build the tiny Qwen2 policy and tokenizer for the embedded CPU demo (`stare train`).

`build_tiny_model` makes, from nothing but a seed and the bundled task, a standard Hugging Face
model directory that everything downstream loads by path, exactly like a real checkpoint:

    model = AutoModelForCausalLM.from_pretrained(path)
    tokenizer = AutoTokenizer.from_pretrained(path)

Steps: (a) a character-level tokenizer over the task's alphabet plus <pad>, <eos>, <unk>;
(b) a small Qwen2 (2 layers, hidden 128, 0.3M parameters by default, fp32); (c) a supervised warm
start on reference solutions (with randomly drawn, equally correct variants), stopped as soon as
greedy accuracy on train-split problems reaches a target (0.45), so the model has only partly
learned the task: held-out greedy accuracy stays well inside (0, 1) and sampling at temperature
1.0 keeps real entropy (the room that GRPO collapses and STARE is meant to hold); (d)
`save_pretrained` of both, plus `build_info.json` with the arguments, their hash and measured
accuracy and entropy. About a minute on one core; see docs/tiny-model.md for measurements.

Prompt format: the problem's prompt text, tokenized as is (no BOS, no chat template); the
completion follows directly and ends with <eos>.

Multi-turn tasks (tool use): a task with `solution_segments(problem, rng) -> [(text, trained)]`
has its untrained parts (tool observations) masked out of the warm-start loss, as RL masks them;
a task with `whole_tokens` gets those strings as single tokens (tags, fixed JSON heads); a task
with `warm_start_sandbox()` is evaluated through the rollout's `ToolAgent` (HFEngine on a copy of
the weights, tool calls answered by that sandbox), since its answers need the tool's output.

The saved tokenizer pads on the left (for batched generation); `generation_config.json` carries
the eos and pad ids so `generate` stops at <eos>.

Determinism: the build runs on one thread with seeded RNGs, so the same arguments give the same
weights bit for bit on the same torch build. A directory whose `build_info.json` has the same
arguments hash is reused without retraining.

Not covered: anything beyond the toy regime (no BPE merges, no chat format, no GPU path).
"""

from stare.models.tiny.build import build_tiny_model, main
from stare.models.tiny.measure import evaluate, greedy_accuracy, response_mask
from stare.models.tiny.spec import BUILD_VERSION, EvalResult, TinyModelSpec, default_cache_dir, default_model_dir
from stare.models.tiny.tokenizer import build_tokenizer
from stare.models.tiny.warm_start import _sft_batch

__all__ = [
    "BUILD_VERSION",
    "EvalResult",
    "TinyModelSpec",
    "_sft_batch",
    "build_tiny_model",
    "build_tokenizer",
    "default_cache_dir",
    "default_model_dir",
    "evaluate",
    "greedy_accuracy",
    "main",
    "response_mask",
]
