"""The learner's memory discipline against the same run's unchunked / padded baseline.

Three measurements (`run(quick)` returns one dict each; `stare bench` prints them):
  * logprob_peak_memory: peak resident memory of the log-prob + entropy computation (forward and
    backward) over N response tokens at vocabulary 151,936 (Qwen2.5's), chunked
    (`learner/step/logprobs.py`, chunks of N/8 tokens) vs the full [N, V] fp32 log-softmax. Each variant
    runs in a fresh Python process; the figure is the OS's peak RSS of that process
    (`ru_maxrss`) minus its RSS just before the computation, so every byte torch's allocator
    touched counts. Target ratio <= 0.25.
  * logprob_time: CPU time (process time: the machine may be shared) of the same two
    computations, median of interleaved runs, with glibc's default allocator (what a CPU run
    gets: the full computation's larger allocations fault in more fresh pages, which is part of
    what chunking saves on CPU; with the allocator keeping memory, as on a GPU, the chunked
    computation costs 1.2-1.3x the full one's CPU time here, its backward recomputing the logits:
    the gpu-logprob-time row measures that case). Target <= 1.15.
  * packing_tokens_per_s: one learner step (pre-pass, then forward + loss + backward per
    micro-batch; `learner/step/forward_passes.py`) of a small random Qwen2 on a long-tailed length mix, real
    tokens per CPU-second, with token-budget packed micro-batches vs fixed padded micro-batches of
    the same worst-case size (budget = rows x longest sequence), the median of per-repeat ratios
    (the three cuts interleaved, timed with the allocator keeping freed memory,
    `stare.app.bench.common.allocator_keeps_memory`: their page faults were noise of the same size
    for all three). Target >= 1.3. Also the token budget unpacked (binning_tokens_per_s): on CPU, sdpa attends packed rows through a
    block-diagonal mask and so computes T^2 attention scores per packed row (flash-attention's
    varlen kernel on GPU does not).

Usage: python stare/app/bench/bench_learner_memory.py [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

VOCAB = 151_936


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _logprob_case(n: int, hidden: int, seed: int = 0):
    import torch

    g = torch.Generator().manual_seed(seed)
    head = torch.nn.Linear(hidden, VOCAB, bias=False)
    with torch.no_grad():
        head.weight.normal_(0, 0.05, generator=g)
    h = torch.randn(n, hidden, generator=g).requires_grad_(True)
    targets = torch.randint(0, VOCAB, (n,), generator=g)
    return head, h, targets


def _logprob_step(variant: str, head, h, targets, chunk: int) -> None:
    """Forward and backward of the log-probs and entropy of every row of `h`."""
    import torch

    from learner.step.logprobs import chunked_logprobs_and_entropy

    if variant == "chunked":
        logp, ent = chunked_logprobs_and_entropy(head, h, targets, chunk_tokens=chunk)[:2]
    else:  # the learner before chunking: the whole [N, V] fp32 log-softmax at once
        logp_full = torch.log_softmax(head(h).float(), -1)  # [N, V]
        logp = logp_full.gather(-1, targets[:, None]).squeeze(-1)
        ent = -(logp_full.exp() * logp_full).sum(-1)
    (logp.sum() + 0.1 * ent.sum()).backward()


def _measure_peak(variant: str, n: int, hidden: int, chunk: int) -> int:
    """Run in a fresh process: peak RSS growth (bytes) of one forward + backward."""
    import torch

    import learner.step.logprobs  # noqa: F401  (imported before the measurement)

    torch.set_num_threads(1)
    head, h, targets = _logprob_case(n, hidden)
    head.weight.grad = torch.zeros_like(head.weight)  # the gradient buffer exists before, as in training
    before = _rss_bytes()
    _logprob_step(variant, head, h, targets, chunk)
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - before


def _peak_in_subprocess(variant: str, n: int, hidden: int, chunk: int) -> int:
    out = subprocess.run(
        [sys.executable, os.path.abspath(__file__), "--peak", variant, str(n), str(hidden), str(chunk)],
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    )
    return int(out.stdout.strip().splitlines()[-1])


def _time_logprobs(n: int, hidden: int, chunk: int, repeats: int) -> tuple[list[float], list[float]]:
    """CPU seconds of each repeat, chunked and full, interleaved (pairs back to back)."""

    head, h, targets = _logprob_case(n, hidden)
    times: dict[str, list[float]] = {"chunked": [], "full": []}
    for variant in times:  # warm-up
        _logprob_step(variant, head, h, targets, chunk)
    for _ in range(repeats):  # interleaved so drift hits both equally
        for variant in times:
            t0 = time.process_time()
            _logprob_step(variant, head, h, targets, chunk)
            times[variant].append(time.process_time() - t0)
    return times["chunked"], times["full"]


def _lengths(rows: int, longest: int, seed: int = 0) -> list[int]:
    """A long tail: most responses short, a few near the cap (Pareto, like RL rollouts at a length cap)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    return [int(min(longest, 16 + rng.pareto(1.1) * 40)) for _ in range(rows)]


def _packing_tokens_per_s(quick: bool) -> tuple[dict[str, list[float]], dict]:
    import numpy as np
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from learner.algorithm.step_plan import StepTokens, mean_entropy, plan_step
    from learner.step.batch import collate
    from learner.step.forward_passes import Policy, hidden_state_fn, prepass, train_pass
    from learner.step.micro_batches import build_micro_batch, plan_rows
    from stare.app.bench.common import rotated
    from stare.config.algo import StareLossConfig
    from stare.transport.records import Trajectory

    rows, longest, prompt = (32, 256, 16) if quick else (64, 768, 32)
    micro = 4
    budget = micro * (prompt + longest)  # the padded micro-batch's worst case: same peak memory bound
    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=4096,
        hidden_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=768,
        max_position_embeddings=2048,
        attn_implementation="sdpa",
    )
    model = Qwen2ForCausalLM(config)
    rng = np.random.default_rng(1)
    trajs = []
    for i, n in enumerate(_lengths(rows, longest)):
        trajs.append(
            Trajectory(
                run_id="b",
                trajectory_id=str(i),
                group_id=str(i // 8),
                group_size=8,
                weight_version=0,
                prompt_token_ids=rng.integers(2, 4096, prompt).astype(np.int32),
                response_token_ids=rng.integers(2, 4096, n).astype(np.int32),
                response_logprobs=-rng.random(n).astype(np.float32),
                loss_mask=np.ones(n, dtype=np.uint8),
                finish_reason="stop",
                answer="",
                problem_id=str(i // 8),
                data_source="b",
                reward=float(i % 2),
            )
        )
    batch = collate(trajs, pad_id=0, rows=rows)
    real_tokens = sum(prompt + len(t.response_token_ids) for t in trajs)
    policy = Policy(
        hidden=hidden_state_fn(model, model, torch.device("cpu")),
        lm_head=model.lm_head,
        device=torch.device("cpu"),
        chunk_tokens=2048,
    )
    cfg = StareLossConfig(variant="C2")
    lens = [len(p) for p in batch.prompts], [len(r) for r in batch.responses]

    def one_step(max_tokens, pack) -> tuple[float, int]:
        groups = plan_rows(*lens, micro_batch=micro, max_tokens=max_tokens, pack=pack)
        mbs = [build_micro_batch(g, batch.prompts, batch.responses, pad_id=0, pack=pack) for g in groups]
        t0 = time.process_time()
        model.eval()
        old, ent, dh = prepass(policy, mbs, batch, predicted_entropy_change=False)
        model.train()
        ctx = plan_step(
            StepTokens(old, ent, batch.advantages, batch.token_uid, batch.mask), cfg, gate=1.0, w=1.1, m=0.9
        )
        train_pass(
            policy,
            mbs,
            batch,
            old,
            ent,
            dh,
            ctx,
            cfg,
            mean_entropy(ent, batch.mask, cfg.agg_mode),
            lambda loss, last: loss.backward(),
        )
        model.zero_grad(set_to_none=True)
        return time.process_time() - t0, sum(mb.model_tokens for mb in mbs)

    cuts = {"packed": (budget, True), "binned": (budget, False), "padded": (None, False)}
    tokens_per_s: dict[str, list[float]] = {k: [] for k in cuts}  # per repeat
    model_tokens = {}
    for args in cuts.values():  # warm-up
        one_step(*args)
    for r in range(4 if quick else 5):  # interleaved so drift hits all equally, rotating who goes first
        for name in rotated(list(cuts), r):
            t, model_tokens[name] = one_step(*cuts[name])
            tokens_per_s[name].append(real_tokens / t)
    info = {
        "rows": rows,
        "longest": longest,
        "real_tokens": real_tokens,
        "budget": budget,
        "micro_batch": micro,
        **{f"model_tokens_{k}": v for k, v in model_tokens.items()},
    }
    return tokens_per_s, info


def _row(name, what, ours, baseline, unit, target, higher_is_better) -> dict:
    ratio = ours / baseline if baseline else float("inf")
    ok = ratio >= target if higher_is_better else ratio <= target
    return {
        "name": name,
        "what": what,
        "ours": ours,
        "baseline": baseline,
        "unit": unit,
        "ratio": ratio,
        "target": target,
        "higher_is_better": higher_is_better,
        "pass": bool(ok),
    }


def run(quick: bool = False) -> list[dict]:
    import torch

    from stare.app.bench.common import allocator_keeps_memory, paired_row

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # CPU-time figures: one thread, so process time is compute time
    n, hidden = (512, 64) if quick else (1024, 128)
    chunk = n // 8
    peak_ours = _peak_in_subprocess("chunked", n, hidden, chunk)
    peak_base = _peak_in_subprocess("full", n, hidden, chunk)
    t_ours, t_base = _time_logprobs(n, hidden, chunk, repeats=5 if quick else 11)
    with allocator_keeps_memory():  # the three cuts allocate alike: their page faults are noise here
        tps, info = _packing_tokens_per_s(quick)
    torch.set_num_threads(threads)
    case = f"{n} tokens x vocab {VOCAB}, hidden {hidden}, chunks of {chunk}"
    return [
        _row(
            "logprob_peak_memory",
            f"peak RSS of log-prob+entropy fwd+bwd, {case}: chunked vs full [N, V] fp32",
            peak_ours / 2**20,
            peak_base / 2**20,
            "MiB",
            0.25,
            False,
        ),
        paired_row(
            "logprob_time",
            f"CPU time of log-prob+entropy fwd+bwd, {case}: chunked vs full",
            t_ours,
            t_base,
            unit="s",
            target=1.15,
            higher_is_better=False,
        ),
        paired_row(
            "packing_tokens_per_s",
            f"learner step tokens per CPU-second, {info['rows']} rows long-tailed to {info['longest']}: token "
            f"budget {info['budget']} packed ({info['model_tokens_packed']} model tokens) vs "
            f"{info['micro_batch']}-row padded micro-batches ({info['model_tokens_padded']})",
            tps["packed"],
            tps["padded"],
            unit="tokens/s",
            target=1.3,
        ),
        paired_row(
            "binning_tokens_per_s",
            f"the same with token-budget micro-batches padded, not packed (pack_sequences=false; "
            f"{info['model_tokens_binned']} model tokens; informational, target: no slower)",
            tps["binned"],
            tps["padded"],
            unit="tokens/s",
            target=1.0,
        ),
    ]


def main(argv=None) -> None:
    if argv is None and len(sys.argv) > 1 and sys.argv[1] == "--peak":
        variant, n, hidden, chunk = sys.argv[2], *map(int, sys.argv[3:6])
        print(_measure_peak(variant, n, hidden, chunk))
        return
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="smaller sizes (seconds)")
    p.add_argument("--json", action="store_true", help="print the result rows as JSON")
    args = p.parse_args(argv)
    rows = run(quick=args.quick)
    if args.json:
        print(json.dumps(rows, indent=1))
        return
    for r in rows:
        print(
            f"{r['name']:<22} ours {r['ours']:>12.4g} {r['unit']:<9} baseline {r['baseline']:>12.4g}  "
            f"ratio {r['ratio']:.3f} (target {'>=' if r['higher_is_better'] else '<='} {r['target']}) "
            f"{'PASS' if r['pass'] else 'FAIL'}\n    {r['what']}"
        )


if __name__ == "__main__":
    main()
