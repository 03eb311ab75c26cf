"""The benchmarks `stare bench` knows: an explicit dict, name -> Benchmark.

Each benchmark is a module of stare.app.bench (this folder) with a function `run(quick: bool) ->
list[dict]` returning rows (stare.app.bench.common.row): its figures against a baseline measured in
the same run. Modules are imported only when a benchmark runs, so `stare bench --help` is instant.
GPU benchmarks return one skipped row each, saying why, where CUDA is absent.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Benchmark:
    module: str  # under stare.app.bench
    summary: str  # one line for --help
    gpu: bool = False  # the GPU section
    function: str = "run"

    def run(self, quick: bool) -> list[dict[str, Any]]:
        return getattr(importlib.import_module(f"stare.app.bench.{self.module}"), self.function)(quick)


BENCHMARKS: dict[str, Benchmark] = {
    "loss": Benchmark("bench_loss", "STARE vs GRPO loss, one step's micro-batches from logits (time, <= 1.03)"),
    "transport": Benchmark("bench_transport", "RedisStream vs raw redis-py, 1k/8k-token trajectories (>= 0.95)"),
    "broadcast": Benchmark("bench_broadcast", "weight broadcast vs a raw gloo dist.broadcast loop (>= 0.95)"),
    "overlap": Benchmark("bench_overlap", "stare up steps/min, async (max_staleness 1) vs sync (>= 1.5)"),
    "rollout": Benchmark("bench_rollout", "rollout worker (streams, weight checks) vs its bare engine (>= 0.9)"),
    "learner": Benchmark(
        "bench_learner",
        "a STARE step through DeepSpeed vs a plain torch loop (>= 0.9); without its pre-pass vs with (>= 1.1)",
    ),
    "learner-memory": Benchmark(
        "bench_learner_memory",
        "chunked log-prob memory/time at vocab 151,936 (<= 0.25, <= 1.15); token-budget packing tokens/s (>= 1.3)",
    ),
    "step": Benchmark("bench_step", "one embedded step: rollout / reward / learn / publish shares (no target)"),
    "gpu-learner": Benchmark(
        "bench_gpu", "GPU: learner tokens/s and MFU vs a bf16 matmul", gpu=True, function="run_learner"
    ),
    "gpu-logprob-memory": Benchmark(
        "bench_gpu",
        "GPU: log-prob/entropy peak memory at vocab 151,936 vs full log-softmax (<= 0.25)",
        gpu=True,
        function="run_logprob_memory",
    ),
    "gpu-generate": Benchmark(
        "bench_gpu_generate",
        "GPU: HF engine generation tokens/s vs transformers generate",
        gpu=True,
        function="run_generate",
    ),
}

SECTIONS: dict[str, list[str]] = {
    "cpu": [n for n, b in BENCHMARKS.items() if not b.gpu],
    "gpu": [n for n, b in BENCHMARKS.items() if b.gpu],
}


def select(names: list[str]) -> list[str]:
    """Benchmark names from names and section names ("cpu", "gpu"); none: all. Unknown names raise
    a ValueError listing the valid ones."""
    if not names:
        return list(BENCHMARKS)
    out: list[str] = []
    for n in names:
        if n in SECTIONS:
            out += [m for m in SECTIONS[n] if m not in out]
        elif n in BENCHMARKS:
            if n not in out:
                out.append(n)
        else:
            raise ValueError(
                f"unknown benchmark {n!r}; valid names: {', '.join(BENCHMARKS)} (sections: {', '.join(SECTIONS)})"
            )
    return out
