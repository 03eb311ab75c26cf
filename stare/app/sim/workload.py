"""What a simulated run samples and scores: the workload settings of `stare sim` (`--set sim.*`).

A run config says how many prompts a step samples and how long a response may be; how long responses are,
how many groups dynamic sampling filters, what evaluation and scoring cost, are properties of the model and
the data. They are settings here, each with its default and the public figure it comes from:

| setting | default | meaning and source |
| --- | --- | --- |
| `sim.response_mean` | 1,050 | mean response tokens (before the cap); NeMo-RL v0.5's Llama-3.1-8B GRPO averages 1,019 on policy and 1,123 one step off (docs/about/performance-summary.md); no first-party figure for Qwen2.5-Math-7B on DAPO-17k at a 3,072 cap was found, so the 7B recipe uses this default and docs/performance.md shows what +/-25% does |
| `sim.response_sigma` | 0.6 | log-space sigma of the lognormal (a long tail: ROLL Flash, arXiv 2510.11345, reports the longest responses exceeding the median more than 20x) |
| `sim.response_growth` | 0.0 | relative growth of the mean per 1,000 training steps (RL lengthens or shortens responses over training: DeepScaleR's 8K stage went from 5,500 to 3,500 tokens, then grew with 16K/24K) |
| `sim.at_step` | 0 | the training step the simulated node is at (the mean is response_mean x (1 + growth x at_step / 1000)) |
| `sim.prompt_tokens` | 200 | mean prompt tokens (+/- 25%); NeMo-RL's OpenMathInstruct-2 prompts average ~129 (its published tokens/s x s/step x GPUs over 2,048 samples, less the response mean) |
| `sim.solve_a`, `sim.solve_b` | 1, 1 | solve rates Beta(a, b): a group whose samples all score the same is filtered by dynamic sampling (a run's `filtered_groups` metric says what its data does) |
| `sim.eval_length_factor` | 1.5 | held-out responses (AIME) over training responses; capped like them |
| `sim.reward_s_per_traj` | 0.005 | CPU seconds a reward worker spends scoring one trajectory (math verification; assumption) |
| `sim.reward_workers` | 2 | reward worker processes (`stare up --reward`) |
| `sim.zero3_head` | per_micro_batch | per_chunk: the ZeRO-3 output head gathered per log-prob chunk and the recompute |
| `sim.extra_forward` | 0 | no-grad forwards besides the pre-pass each step (a reference policy's log-probs) |
| `sim.learner_framework` | zero | zero: DeepSpeed ZeRO / FSDP (stare's learner); megatron: a peer's Megatron-core learner (validation) |
| `sim.learner_offload` | false | a peer's learner that moves its optimizer state to the host and back every step (verl's colocated FSDP `optimizer_offload`); stare's own is `system.colocate_offload` |
"""

from __future__ import annotations

import math
from dataclasses import dataclass

SIM_FIELDS: dict[str, object] = {
    "sim.response_mean": 1050.0,
    "sim.response_sigma": 0.6,
    "sim.response_growth": 0.0,
    "sim.at_step": 0,
    "sim.prompt_tokens": 200,
    "sim.solve_a": 1.0,
    "sim.solve_b": 1.0,
    "sim.eval_length_factor": 1.5,
    "sim.reward_s_per_traj": 0.005,
    "sim.reward_workers": 2,
    "sim.zero3_head": "per_micro_batch",
    "sim.extra_forward": 0,
    "sim.learner_framework": "zero",
    "sim.learner_offload": False,
}
CHOICES = {"sim.zero3_head": ("per_chunk", "per_micro_batch"), "sim.learner_framework": ("zero", "megatron")}


@dataclass(frozen=True)
class LengthModel:
    """Response lengths: a lognormal with the given mean and log-space sigma, truncated at `cap` (a capped
    sample is a "length" finish). Long-tailed like RL rollouts: the longest of a batch is several times the
    mean."""

    mean: float
    sigma: float
    cap: int

    def sample(self, rng, n: int):
        import numpy as np

        mu = math.log(self.mean) - self.sigma**2 / 2
        x = rng.lognormal(mu, self.sigma, n)
        return np.clip(np.rint(x), 1, self.cap).astype(int)

    def scaled(self, factor: float) -> LengthModel:
        """The same shape with its mean times `factor` (the held-out set's longer responses)."""
        return LengthModel(self.mean * factor, self.sigma, self.cap)


def length_model(mean: float, sigma: float, cap: int, *, growth: float = 0.0, at_step: int = 0) -> LengthModel:
    """The lengths of a run at training step `at_step`: the mean grown by `growth` per 1,000 steps."""
    return LengthModel(mean * (1 + growth * at_step / 1000), sigma, cap)


def fit_lognormal(lengths) -> tuple[float, float]:
    """(mean, sigma) of a lognormal fitted to observed lengths by moments of their logs."""
    import numpy as np

    logs = np.log(np.maximum(np.asarray(lengths, dtype=float), 1.0))
    sigma = float(logs.std())
    return float(math.exp(logs.mean() + sigma**2 / 2)), sigma
