"""How a run runs: the system (workers, staleness, weight sync, checkpoints), control-plane and logging sections."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, model_validator

from stare.config.base import _Section


def _on_off(value: Any) -> Any:
    """YAML reads a bare on/off (`colocate: on`, `--set system.colocate=off`) as a boolean."""
    return {True: "on", False: "off"}.get(value, value) if isinstance(value, bool) else value


class SystemSection(_Section):
    """The distributed system (`stare up`, `stare rollout|reward|learner|control`): Redis, weight
    sync, staleness, heartbeats; and the rollout engine sharing the learner's GPUs (colocate, colocate_offload:
    one GPU in the embedded `stare train`, which ignores the rest, or every learner rank's)."""

    colocate: Annotated[Literal["auto", "on", "off"], BeforeValidator(_on_off)] = Field(
        "auto",
        description="The rollout engine in the learner's process, asleep while the learner steps (vLLM: "
        "built with enable_sleep_mode, LLM.sleep(level=1): weights to host memory, KV cache freed; hf: weights to host "
        "memory), woken to sample with the learner's newest weights, taken in place. `stare train` (one process): "
        "auto: on when the learner and the engine use the same CUDA device; on: always (vllm needs CUDA for it; on "
        "CPU the hf engine still releases its weights); off: both stay resident. `stare up` / `stare learner`: on "
        "is the node-colocated learner: every learner rank hosts an engine on its own GPU (system.learner_ranks; "
        "`stare up` gives the ranks every GPU and starts no rollout worker), rank 0 has every rank sample the "
        "round's prompts, then they train (for on-policy runs, max_staleness 0; no tool loop, "
        "tensor_parallel_size 1); auto and off: rollout worker processes on GPUs of their own (a shared GPU's "
        "memory split by rollout.engine.gpu_memory_utilization). docs/deploy.md, 'One GPU' and 'A colocated node'.",
    )
    colocate_offload: Literal["auto", "none", "optimizer"] = Field(
        "auto",
        description="Colocated: what of the learner leaves the GPU while the engine samples. optimizer: its "
        "optimizer state (fp32 master weights, Adam moments) and gradient partitions go to pinned host memory and "
        "come back as the engine sleeps again (DeepSpeed's offload_states/reload_states; ZeRO-0: the torch "
        "optimizer's moments, the fp16/bf16 wrapper's fp32 master copy stays); costs two host copies of that state "
        "per wake (each sampling round of a step, each evaluation). none: everything stays. auto: optimizer when "
        "`stare plan --gpus 1` says the awake engine does not fit beside the resident learner, else none "
        "(none on CPU; the node-colocated learner: none, its plan is `stare plan --gpus N` with colocate on).",
    )

    redis_url: str = Field(
        "redis://127.0.0.1:6379/0",
        pattern=r"^rediss?://",
        description="Redis URL of the run's streams and state (the STARE_REDIS_URL environment variable and "
        "--redis-url override it).",
    )
    max_staleness: int = Field(
        1,
        ge=0,
        description="Largest weight-version lag the learner trains on; 0 is strictly on-policy. The learner "
        "keeps prompts_per_step x (1 + max_staleness) groups in flight and stamps each prompt with its weight "
        "version; rollout waits for that version before sampling it.",
    )
    learner_ranks: int = Field(
        1,
        ge=1,
        le=64,
        description="Processes of the learner (DeepSpeed data-parallel ranks, one per learner GPU, ZeRO "
        "shards across them). Rank 0 owns the Redis side and hands each rank whole groups of every step; `stare "
        "learner` starts the other ranks itself on its node (an external launcher such as torchrun that sets "
        "WORLD_SIZE overrides this). `stare up --learner-ranks` sets it.",
    )
    stale_policy: Literal["drop", "importance"] = Field(
        "drop",
        description="Trajectories older than max_staleness: drop (counted) or train them with truncated "
        "importance correction against the rollout log-probs (loss.rollout_correction must be set).",
    )
    weight_sync: Literal["broadcast", "filesystem"] = Field(
        "broadcast",
        description="broadcast: a point-to-point group (gloo or NCCL: weight_sync_communicator) formed "
        "at run time through a TCPStore the learner hosts; filesystem: safetensors under weight_dir with the version "
        "pointer in Redis. With max_staleness >= 1 the learner publishes in the background (it does not wait for "
        "the sync; at most one version in flight, a newer one replaces a waiting one).",
    )
    weight_sync_communicator: Literal["auto", "gloo", "nccl"] = Field(
        "auto",
        description="Communicator of the broadcast: nccl sends from the learner's GPU to each vLLM worker's "
        "GPU; gloo goes through host memory and TCP; auto: nccl for a group whose learner and every worker have NCCL on "
        "a GPU of their own (NCCL refuses two ranks on one GPU), else gloo. nccl in a process without CUDA refuses to "
        "start; workers sharing a GPU with another member stay out of an nccl group.",
    )
    weight_sync_bucket_mb: int = Field(
        256,
        ge=1,
        description="Broadcast bucket size in MiB: small tensors are packed into two buckets of this size "
        "on the learner (on the GPU with nccl); larger tensors are sent in chunks of this size from their own memory.",
    )
    weight_sync_publish_from: Literal["auto", "host", "device"] = Field(
        "auto",
        description="Where the learner's published weights are read from. device: from GPU memory, sent by "
        "NCCL with no host round trip (ZeRO 0-2: the parameters themselves when the publish is synchronous, one device "
        "copy when it runs in the background; ZeRO-3: each parameter gathered and copied on the GPU); host: a copy in "
        "pinned host memory made on a side stream (what gloo and the filesystem backend send); auto: device when the "
        "broadcast may use NCCL (a GPU learner, weight_sync_communicator not gloo, tensor_parallel_size 1), else host. "
        "The node-colocated learner (colocate on in `stare up`) hands each rank's engine its own learner's weights in "
        "process: auto and device on the GPU (ZeRO 0-2: the parameters themselves; ZeRO-3: gathered on every rank, a "
        "whole copy beside the waking engine until it has loaded them), host through pinned host memory (no copy on "
        "the GPU).",
    )
    weight_dir: Path | None = Field(
        None,
        description="Shared folder of the filesystem weight backend (None: <run dir>/weights).",
    )
    broadcast_host: str = Field("127.0.0.1", description="Address the learner's TCPStore listens on / workers dial.")
    broadcast_port: int = Field(
        29650,
        ge=0,
        le=65535,
        description="Port of the learner's TCPStore rendezvous (0: any free port). The learner announces the port it "
        "bound in the run's Redis, where rollout workers find it; `stare up` always uses 0.",
    )
    broadcast_timeout_s: float = Field(
        30.0,
        gt=0,
        description="Timeout of a weight broadcast and of joining it; a worker slower than this is "
        "dropped from the group and rejoins later.",
    )
    heartbeat_s: float = Field(2.0, gt=0, description="Seconds between a role's heartbeats in Redis.")
    stall_s: float = Field(
        120.0,
        gt=0,
        description="A role whose main loop has not ticked for this long is unhealthy (GET /healthz "
        "503; the compose healthcheck and Kubernetes liveness probe restart it). Long work inside RoleRuntime.busy "
        "(evaluation, a training step) counts as ticking while its thread uses CPU; a hung thread does not.",
    )
    dead_after_s: float = Field(
        15.0,
        gt=0,
        description="A role whose last heartbeat is older than this is reported down (dead), and /v1/status says "
        "phase down when it is the learner: at most this long after it died, at least this minus heartbeat_s. At "
        "least 2 x heartbeat_s, so that one late beat does not mark a live role down.",
    )
    forget_after_s: float = Field(
        300.0,
        gt=0,
        description="A role that is not alive (stopped cleanly: 'gone'; or dead) stays in /v1/status "
        "and stare_role_up for this long after its last heartbeat, then it is no longer listed (redeploys leave "
        "no ghost workers).",
    )
    claim_idle_s: float = Field(
        30.0,
        gt=0,
        description="A stream entry pending this long on one consumer (a dead one) is reclaimed by another.",
    )
    lost_group_check_s: float = Field(
        120.0,
        ge=0.1,
        le=86_400.0,
        description="A distributed learner that has waited this long for data says what it waits for and looks for "
        "published groups that exist nowhere any more (no record in any stream, e.g. lost with a Redis crash under "
        "appendfsync everysec); a group missing at two such looks in a row is published again (reissued_groups_total).",
    )
    max_backlog: int = Field(
        2048,
        ge=1,
        description="Bound of each stream's unacknowledged entries; producers wait (backpressure). "
        "The roles add room for what the learner holds until its next checkpoint: "
        "(run.checkpoint_every + max_staleness + 2) x prompts_per_step x samples_per_prompt.",
    )
    max_deliveries: int = Field(
        5,
        ge=2,
        description="A stream entry delivered more than this many times without an ack (it keeps failing or "
        "killing its consumer) goes to the run's dead-letter stream with its last error.",
    )
    rollout_batch_prompts: int = Field(
        8,
        ge=1,
        description="Prompts a rollout worker samples per batch (each gives samples_per_prompt trajectories).",
    )
    rollout_streaming: bool | None = Field(
        None,
        description="Feed the rollout engine continuously (rollout/streaming.py): the worker keeps as many "
        "prompts in the engine as its KV cache holds at max_model_len (capacity / samples_per_prompt), adds one as "
        "soon as a group finishes and publishes each group when its last sample ends (rollout_batch_prompts is then "
        "unused for sampling). Off: one blocking batch of rollout_batch_prompts at a time. None: on for the vllm "
        "engine, off for hf (whose batch loop it reproduces exactly); the tool loop always samples in batches.",
    )
    inflight_weight_updates: bool = Field(
        False,
        description="A streaming rollout engine takes each new weight version between two decode steps, with "
        "sequences in flight (PipelineRL's semantics: they go on with the KV cache computed so far, their later tokens "
        "from the new weights), instead of draining first. Every record carries the version of each token "
        "(Trajectory.version_starts) and the learner bounds staleness per token: a token more than max_staleness "
        "versions old leaves the loss (stale_policy drop) or is importance-corrected against its recorded log-prob "
        "(importance); a group is dropped as stale only when none of its tokens is within the bound. Needs "
        "max_staleness >= 1 and a streaming engine (rollout_streaming not false, no tool loop). Off: a version "
        "changes only with nothing in flight. docs/distributed.md, 'In-flight weight updates'.",
    )
    health_port: int = Field(
        0,
        ge=0,
        le=65535,
        description="Port of each role's HTTP liveness endpoint GET /healthz (0: off; the "
        "STARE_HEALTH_PORT environment variable overrides it). The control plane has its own /v1/health.",
    )

    @model_validator(mode="after")
    def _dead_after_spans_two_beats(self) -> SystemSection:
        if self.dead_after_s < 2 * self.heartbeat_s:
            raise ValueError(
                f"system.dead_after_s {self.dead_after_s:g} is under 2 x system.heartbeat_s {self.heartbeat_s:g}: "
                "one late heartbeat would report a live role down; raise dead_after_s or lower heartbeat_s"
            )
        return self


class ControlPlaneSection(_Section):
    """The control plane (FastAPI; `stare control`, and on localhost inside `stare train`)."""

    host: str = Field("127.0.0.1", description="Address the API listens on (0.0.0.0 in containers).")
    port: int = Field(8321, ge=0, le=65535, description="API port (0: any free port).")
    serve_in_train: bool = Field(True, description="`stare train` serves the API and dashboard on localhost.")
    token_file: Path | None = Field(
        None,
        description="File holding the bearer token for mutating endpoints (STARE_API_TOKEN in the "
        "environment takes precedence). No token: mutating endpoints are refused unless allow_unauthenticated.",
    )
    read_token_file: Path | None = Field(
        None,
        description="File holding a token that only reads (STARE_API_READ_TOKEN in the environment takes "
        "precedence): for Prometheus, Grafana and dashboard viewers, who then never hold the write token. With one, "
        "every read endpoint needs a token (this one or the write token). The compose deployment sets it.",
    )
    auth_reads: bool = Field(
        False, description="Require a token on read endpoints too (the write token, or the read token when one is set)."
    )
    allow_unauthenticated: bool = Field(
        False,
        description="Allow mutating calls without any token configured (local experiments only).",
    )
    trusted_hosts: list[str] | None = Field(
        None,
        description="Host header values the API answers (others: 400; stops DNS rebinding), e.g. "
        "['stare-control', 'stare.example.org']; '*' allows any. None: the loopback names when host is a loopback "
        "address, else any host.",
    )
    allowed_origins: list[str] = Field(
        default_factory=list,
        description="Browser origins besides the API's own allowed to make changes "
        "(e.g. ['https://dash.example.org']); other cross-site changes are refused with 403 in every auth mode.",
    )
    docs: bool = Field(
        False,
        description="Serve Swagger UI at /docs (it loads its scripts from a CDN); /openapi.json is always served.",
    )
    max_body_bytes: int = Field(
        65536,
        ge=1024,
        le=16 * 1024 * 1024,
        description="Largest request body "
        "accepted (413 above it, checked before the body is read or the token checked).",
    )
    body_timeout_s: float = Field(
        10.0, gt=0.0, le=300.0, description="A request body that stops arriving for this long is answered 408."
    )
    header_timeout_s: float = Field(
        10.0,
        gt=0.0,
        le=300.0,
        description="A connection whose request headers are "
        "not complete this long after it opened (or after its previous response) is closed.",
    )
    keepalive_timeout_s: int = Field(5, ge=1, le=300, description="Idle keep-alive connections close after this long.")
    max_connections: int = Field(
        512,
        ge=8,
        le=100_000,
        description="Connections (and requests) served at once; "
        "above it new requests get 503. Each open SSE stream holds one.",
    )


class WandbSection(_Section):
    """Weights & Biases logging of a run (pip install 'stare[wandb]'): every metrics.jsonl field per
    step, each held-out evaluation, and the report's figures at the end."""

    project: str = Field(min_length=1, max_length=128, description="W&B project the run is logged to.")
    entity: str | None = Field(
        None, min_length=1, max_length=128, description="W&B team or user (None: the API key's default entity)."
    )
    mode: Literal["online", "offline", "disabled"] = Field(
        "online",
        description="online: stream to the W&B server (needs WANDB_API_KEY); offline: write the run under "
        "WANDB_DIR (default: the run folder) for a later `wandb sync`; disabled: no-op.",
    )
    tags: list[str] = Field(
        default_factory=list, max_length=64, description="Tags of the W&B run (the algo is always added)."
    )


class LoggingSection(_Section):
    """Console logs and optional experiment trackers (TensorBoard events are always written)."""

    every_n_steps: int = Field(
        1,
        ge=1,
        description="When the log stream is not a terminal (a file, a container, CI), `stare train` prints "
        "one line per N steps (step, reward, entropy/target, gate, W/M, tokens/s, step time); on a terminal the "
        "progress bar shows them. The distributed learner logs every N-th step the same way.",
    )
    format: Literal["text", "json"] = Field(
        "text",
        description="text: human-readable lines; json: one JSON object per line for log shippers "
        "(also --log-format json on `stare train` and the role commands).",
    )
    eval_generations: int = Field(
        4,
        ge=0,
        le=1000,
        description="Sample generations kept per data source at each held-out evaluation (verl's "
        "trainer.log_val_generations): the same problems every time (a fixed seeded choice), each with its prompt, "
        "greedy response and score, one sampled response and score, in the run folder's generations.jsonl, "
        "TensorBoard text and a W&B table. 0: none.",
    )
    warn_unk_rate: float = Field(
        0.05,
        ge=0.0,
        le=1.0,
        description="Warn (once) when more than this share of the training prompts' or the responses' tokens are "
        "the tokenizer's unknown token (metrics unk_rate_prompt, unk_rate_response): a tokenizer that does not "
        "cover the data, such as the bundled character-level tiny model fed chat text.",
    )
    warn_zero_reward_steps: int = Field(
        10,
        ge=0,
        description="Warn when the mean reward has been 0 for this many steps in a row, and every that many steps "
        "while it lasts (metric zero_reward_steps). 0: no warning.",
    )
    wandb: WandbSection | None = Field(
        None,
        description="Log the run to Weights & Biases (None: off). Fields below as logging.wandb.FIELD.",
    )
