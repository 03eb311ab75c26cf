"""`stare sim --validate`: peers' published runs, each with its own split and settings, against the model.

Each row is a published setup (its recipe file is the source of every setting given here) and its published
step time and tokens/s/GPU. The sim runs each row's design at the three corners; the table gives published vs
modelled (central [low, high]), the error of the central figure, whether the band holds the published one, and,
for a pair of rows that share a workload, the asynchronous/synchronous ratio on both sides. One setup is held
out of calibration (`held_out`); the criterion is the issue's: the central figure within 20% on every setup,
the band containing the published figure, the async/sync ratio's direction right everywhere.

What the rows are modelled with that the product does not run: a peer's colocated node with tensor-parallel
engines (NeMo-RL's Qwen3-32B, verl's DAPO arm) and a Megatron-core learner (`sim.learner_framework=megatron`)
go through the sim's own colocated path (engines asleep while the learner steps), never offered by
`stare plan`. Settings a peer does not publish are marked "assumed" in the row's notes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stare.app.sim.constants import CORNERS

NEMO = "NVIDIA-NeMo/RL v0.5.0 (6c708930)"
NEMO_TABLE = f"{NEMO} docs/about/performance-summary.md"
VERL = "volcengine/verl (b178a3cd)"
GRPO = "configs/paper/short-cot-qwen2.5-math-7b-grpo-ds.yaml"

# NeMo-RL's GRPO base (examples/configs/grpo_math_1B.yaml) and its 8B recipe: 64 prompts x 32 samples, max total
# length 4,096, CUDA graphs, vLLM's default batch on an H100 (max_num_seqs 1,024), the policy's log-probs and the
# reference policy's (KL 0.01) before training, no dynamic sampling, validation outside the timed step.
# Prompts ~129 tokens: tokens/s/GPU x s/step x GPUs / 2,048 samples less the published generation mean.
_NEMO_COMMON = [
    "rollout.prompts_per_step=64",
    "rollout.samples_per_prompt=32",
    "data.dynamic_sampling=false",
    "data.oversample=1.0",
    "rollout.engine.enforce_eager=false",
    "rollout.engine.max_num_seqs=1024",
    "rollout.engine.max_model_len=4096",
    "sim.extra_forward=1",
    "optim.prepass_early=false",
    "sim.learner_framework=megatron",
    "optim.zero_stage=1",
    "run.checkpoint_every=100000",
    "task.eval_every=100000",
    "system.weight_sync_publish_from=device",
]


@dataclass(frozen=True)
class Row:
    key: str
    title: str
    source: str
    model: str
    gpu: str
    gpus: int
    learner_gpus: int | None  # None: colocated
    overrides: list[str]
    published_s: float
    published_tps: float
    held_out: bool = False
    sync_of: str | None = None  # the synchronous row this asynchronous one is compared with
    notes: str = ""
    config: str = GRPO
    steps: int = 4
    warmup: int = 2
    extra: dict[str, Any] = field(default_factory=dict)


VERL_DAPO_7B = [  # both verl DAPO 7B rows: the recipe's batch, lengths, engines and micro-batch
    "rollout.prompts_per_step=512",
    "rollout.samples_per_prompt=12",
    "rollout.max_new_tokens=8192",
    "rollout.engine.max_model_len=10240",
    "rollout.engine.tensor_parallel_size=2",
    "rollout.engine.gpu_memory_utilization=0.8",
    "rollout.engine.enforce_eager=false",
    "data.max_prompt_len=2048",
    "data.dynamic_sampling=false",
    "data.oversample=1.0",
    "sim.response_mean=1200",
    "sim.prompt_tokens=150",
    "optim.prepass_early=false",
    "optim.max_tokens_per_micro_batch=20480",
]

ROWS: list[Row] = [
    Row(
        "nemo-8b-on",
        "NeMo-RL Llama-3.1-8B GRPO, on policy, colocated on 16 x H100",
        f"{NEMO_TABLE}; recipes llm/performance/grpo-llama3.1-8b-instruct-2n8g.yaml, grpo_math_1B.yaml",
        "configs/models/llama-3.1-8b.json",
        "h100-80gb",
        16,
        None,
        [
            *_NEMO_COMMON,
            "rollout.max_new_tokens=3967",
            "sim.response_mean=1019",
            "sim.prompt_tokens=129",
            "rollout.engine.gpu_memory_utilization=0.6",
            "system.max_staleness=0",
            "system.rollout_streaming=false",
            "system.rollout_batch_prompts=4",
        ],
        92.8,
        1581,
        notes="each of the 16 engines samples its 4 prompts x 32 in one call; Megatron PP 2 (bubble not modelled)",
        steps=3,
        warmup=1,
    ),
    Row(
        "nemo-8b-1off",
        "NeMo-RL Llama-3.1-8B GRPO, one step off, in-flight updates, 8 generate + 8 train",
        f"{NEMO_TABLE}; recipe llm/performance/grpo-llama3.1-8b-instruct-2n8g-async-1off.yaml",
        "configs/models/llama-3.1-8b.json",
        "h100-80gb",
        16,
        8,
        [
            *_NEMO_COMMON,
            "rollout.max_new_tokens=3967",
            "sim.response_mean=1123",
            "sim.prompt_tokens=129",
            "rollout.engine.gpu_memory_utilization=0.8",
            "system.max_staleness=1",
            "system.inflight_weight_updates=true",
        ],
        64.8,
        2478,
        sync_of="nemo-8b-on",
        notes="generation on node 1, training on node 0 (the recipe's colocated: false, 1 node of 8)",
    ),
    Row(
        "nemo-32b-on",
        "NeMo-RL Qwen3-32B GRPO, on policy, colocated on 32 x H100, vLLM TP 4",
        f"{NEMO_TABLE}; recipe llm/performance/grpo-qwen3-32b-4n8g.yaml",
        "configs/models/qwen3-32b.json",
        "h100-80gb",
        32,
        None,
        [
            *_NEMO_COMMON,
            "rollout.max_new_tokens=3993",
            "sim.response_mean=4600",
            "sim.prompt_tokens=103",
            "rollout.engine.tensor_parallel_size=4",
            "rollout.engine.gpu_memory_utilization=0.6",
            "system.max_staleness=0",
            "system.rollout_streaming=false",
            "system.rollout_batch_prompts=8",
        ],
        376,
        571,
        held_out=True,
        notes="published mean 3,251 of 4,096: a lognormal of mean 4,600 (sigma 0.6) capped gives it (assumed); "
        "Megatron TP 4 x PP 4",
        steps=2,
        warmup=1,
    ),
    Row(
        "nemo-32b-1off",
        "NeMo-RL Qwen3-32B GRPO, one step off, in-flight updates, 32 generate (TP 4) + 32 train",
        f"{NEMO_TABLE}; recipe llm/performance/grpo-qwen3-32b-8n8g-async-1off.yaml",
        "configs/models/qwen3-32b.json",
        "h100-80gb",
        64,
        32,
        [
            *_NEMO_COMMON,
            "rollout.max_new_tokens=3993",
            "sim.response_mean=4600",
            "sim.prompt_tokens=103",
            "rollout.engine.tensor_parallel_size=4",
            "rollout.engine.gpu_memory_utilization=0.8",
            "system.max_staleness=1",
            "system.inflight_weight_updates=true",
        ],
        200,
        538,
        held_out=True,
        sync_of="nemo-32b-on",
        notes="as the on-policy row; twice the GPUs",
        steps=3,
        warmup=2,
    ),
    Row(
        "verl-7b-sync",
        "verl DAPO Qwen2.5-Math-7B, colocated sync, 16 x H20, vLLM TP 2, max response 8,192",
        f"{VERL} verl/experimental/one_step_off_policy/shell/dapo_7b_math_fsdp2_colocate.sh; docs/advance/one_step_off.md",
        "configs/models/qwen2.5-math-7b.json",
        "h20",
        16,
        None,
        [
            *VERL_DAPO_7B,
            "sim.learner_offload=true",
            "system.max_staleness=0",
            "system.rollout_streaming=false",
            "system.rollout_batch_prompts=64",
            "run.checkpoint_every=100000",
            "task.eval_every=100000",
        ],
        749,
        0.0,
        notes="FSDP2 with parameter and optimizer offload; no mean response length published: 1,200 assumed (NeMo-RL's "
        "math GRPO averages 1.0-1.1k); verl-project/verl#3250 could not reproduce the published FSDP2 speed-up",
        steps=2,
        warmup=1,
    ),
    Row(
        "verl-7b-1off",
        "verl DAPO Qwen2.5-Math-7B, one step off, 4 generate (2 engines x TP 2) + 12 train, 16 x H20",
        f"{VERL} verl/experimental/one_step_off_policy/shell/dapo_7b_math_fsdp2_4_12.sh; docs/advance/one_step_off.md",
        "configs/models/qwen2.5-math-7b.json",
        "h20",
        16,
        12,
        [
            *VERL_DAPO_7B,
            "system.max_staleness=1",
            "system.rollout_streaming=false",
            "system.rollout_batch_prompts=256",
            "run.checkpoint_every=100000",
            "task.eval_every=100000",
        ],
        520,
        0.0,
        sync_of="verl-7b-sync",
        notes="each generation step samples the whole next batch (one blocking call per engine), one step ahead",
        steps=3,
        warmup=2,
    ),
]


def run_row(row: Row, corners=CORNERS) -> dict[str, dict[str, Any]]:
    """{corner: summary} of a row's design."""
    from stare.app.sim.bands import simulate_band
    from stare.app.sim.design import build_design, split_overrides
    from stare.config import load_config
    from stare.plan.sizes import load_model_shape

    passed, sim = split_overrides(Path(row.config), row.overrides)
    cfg = load_config(Path(row.config), overrides=passed)
    colocated = row.learner_gpus is None
    design = build_design(cfg, sim, gpus=row.gpus, learner_gpus=row.learner_gpus, colocated=colocated)
    design.product_colocation = False  # a peer's colocated node (TP engines, another learner): the sim's model
    shape = load_model_shape(cfg, Path(row.model))
    band = simulate_band(cfg, sim, design, shape, row.gpu, steps=row.steps, warmup=row.warmup, corners=corners)
    return {c: s for c, (_, s) in band.items()}


def table(results: dict[str, dict[str, dict[str, Any]]]) -> str:
    """The validation table in markdown (s/step: published, modelled central [low, high], error, in band)."""
    rows = {r.key: r for r in ROWS}
    out = [
        "| setup | published s/step | modelled s/step | error | in band | async/sync (published / modelled) |",
        "| --- | ---: | ---: | ---: | :---: | --- |",
    ]
    for key, by in results.items():
        r = rows[key]
        s = [by[c]["s_per_step"] for c in by]
        central = by.get("central", by[next(iter(by))])["s_per_step"]
        inside = min(s) <= r.published_s <= max(s)
        ratio = ""
        if r.sync_of in results:
            sync = results[r.sync_of].get("central", next(iter(results[r.sync_of].values())))
            pub = rows[r.sync_of].published_s / r.published_s
            mod = sync["s_per_step"] / central
            ratio = f"{pub:.2f} / {mod:.2f} ({'same direction' if (pub > 1) == (mod > 1) else 'WRONG direction'})"
        mark = " (held out)" if r.held_out else ""
        out.append(
            f"| {r.title}{mark} | {r.published_s:g} | {central:.1f} [{min(s):.1f}, {max(s):.1f}] | "
            f"{central / r.published_s - 1:+.0%} | {'yes' if inside else 'no'} | {ratio} |"
        )
    return "\n".join(out)
