"""The CPU profile of `stare sim --gpu cpu`: the tiny config's costs measured on this machine.

* learn, publish, weights in, reward, other: `stare bench step`'s component times (stare/app/bench/bench_step.py,
  the embedded loop, steps 2..N-1);
* decode: the run's engine timed on a batch of `system.rollout_batch_prompts` prompts and one of
  `rollout.prompts_per_step` prompts (median of `repeats` calls each); each call lasts (its longest
  response) x (a + b x rows), which gives a and b;
* response lengths: a lognormal fitted (costs.fit_lognormal) to every completion of those calls.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable


def calibrate(
    cfg, *, overrides: list[str] = (), bench_steps: int = 8, repeats: int = 3, log: Callable[[str], None] = print
) -> dict:
    """`cfg`: the bundled tiny config with `overrides` (bench step runs that config with them)."""
    from rollout.engines.base import SamplingParams
    from rollout.stack import build_rollout_stack
    from stare.app.bench.bench_step import measure
    from stare.app.sim.workload import fit_lognormal
    from stare.data.feeder import build_feeder

    log(f"stare sim --calibrate: bench step ({bench_steps} steps)")
    rows = {r["name"].split("/", 1)[1]: r["ours"] for r in measure(steps=bench_steps, overrides=list(overrides))}
    stack = build_rollout_stack(cfg, lambda s: None)
    feeder = build_feeder(cfg, stack.setup.task, stack.setup.tokenizer, lambda s: None)
    r = cfg.rollout
    calls, lengths, prompt_lens = {}, [], []
    try:
        for k in (cfg.system.rollout_batch_prompts, r.prompts_per_step):
            times, longest = [], []
            for i in range(repeats):
                prompts = [t.prompt_token_ids for t in feeder.next_tasks(k)]
                prompt_lens += [len(p) for p in prompts]
                params = SamplingParams(
                    n=r.samples_per_prompt,
                    max_new_tokens=r.max_new_tokens,
                    temperature=r.temperature,
                    top_p=r.top_p,
                    seed=1000 + i,
                    stop_token_ids=stack.setup.stop_ids,
                )
                t0 = time.perf_counter()
                out = stack.sampler.generate(prompts, params)
                times.append(time.perf_counter() - t0)
                lens = [len(c.token_ids) for group in out for c in group]
                longest.append(max(lens))
                lengths += lens
            calls[k] = (statistics.median(times), statistics.median(longest), k * r.samples_per_prompt)
            log(f"  generate {k} prompts: {calls[k][0]:.3f} s, longest {calls[k][1]}")
    finally:
        stack.close()
    (t1, s1, n1), (t2, s2, n2) = calls[cfg.system.rollout_batch_prompts], calls[r.prompts_per_step]
    per1, per2 = t1 / s1, t2 / s2  # seconds per engine step at n1 and n2 rows
    b = max((per2 - per1) / (n2 - n1), 0.0) if n2 != n1 else 0.0
    a = max(per1 - b * n1, 0.0)
    mean, sigma = fit_lognormal(lengths)
    steps_per = r.prompts_per_step * r.samples_per_prompt
    return {
        "source": "stare sim --calibrate (bench step + engine timings on this machine)",
        "learn_s": rows["learn"],
        "publish_s": rows["publish"],
        "weights_in_s": rows["weights in"],
        "other_s": rows["other"],
        "reward_s_per_traj": rows["reward"] / steps_per,
        "decode_a_s": a,
        "decode_b_s": b,
        "length_mean": mean,
        "length_sigma": sigma,
        "prompt_mean": statistics.fmean(prompt_lens),
        "calls": {str(k): list(v) for k, v in calls.items()},
        "bench_rollout_s": rows["rollout"],
    }
