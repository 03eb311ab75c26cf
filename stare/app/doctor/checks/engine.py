"""engine: sampling on this node. vLLM (GPU): CUDA graphs, sleep and wake against `stare plan`'s figure, an
in-flight weight update; the transformers engine everywhere (the CPU equivalent). Log-probs are checked
against a recompute by the Hugging Face model itself, on a random tiny model (common.TINY)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING

from stare.app.doctor.checks.common import cuda, missing, tiny_model
from stare.app.doctor.registry import Check, Context, Row, timed

if TYPE_CHECKING:
    import torch

PROMPTS = [[1, 17, 33, 49, 65, 81], [1, 5, 9, 300, 13], [1, 400, 401, 402], [1, 77, 78, 79, 80, 81, 82, 83]]
# An engine's log-prob against the HF recompute of the same token: fp32 (the hf engine) to its rounding; bf16 (vLLM,
# as a GPU run has it) against an fp32 recompute of the bf16-rounded weights: bf16 activations, up to ~0.1.
LOGPROB_TOL = {"float32": 2e-3, "bfloat16": 0.15}
SWITCH = 5  # after an update, log-probs move from the old weights' by at least this many tolerances
UPDATE_AFTER = 4  # engine steps before the in-flight update

CHECKS = [
    Check(
        "engine.hf_sampling",
        "the transformers engine samples (CUDA if present, else CPU) and its log-probs equal the model's recompute",
        "the engine's sampling or log-probs are wrong on this device: the learner's importance ratios would be off",
        "report it with this output; as a workaround rollout.engine.name=hf with another device",
    ),
    Check(
        "engine.vllm_sampling",
        "vLLM (in process, CUDA graphs on) samples and its log-probs equal the recompute; decode tokens/s",
        "vLLM does not start or samples wrongly here (its CUDA build, the driver, the attention backend)",
        "install the vLLM build for this CUDA (pyproject's rollout-gpu extra); "
        "rollout.engine.enforce_eager=true if only graph capture fails",
        gpu=True,
    ),
    Check(
        "engine.vllm_inflight",
        "an in-flight weight update: tokens before the version boundary have the old "
        "weights' log-probs, tokens after it the new weights'",
        "a weight update reached a batch that was already "
        "scheduled, or was not applied: samples carry the wrong version",
        "system.inflight_weight_updates=false (updates between batches) and report it",
        gpu=True,
    ),
    Check(
        "engine.vllm_sleep",
        "sleep level 1 frees the engine's memory down to what `stare plan` counts for a "
        "sleeping engine, and wake gives the same samples",
        "a sleeping engine keeps more than the plan counts "
        "(the CUDA-graph pool, allocator caches): a colocated learner may run out of memory",
        "vLLM >= 0.32 (sleep_mode_offload_cudagraph, which stare sets); else rollout.engine.enforce_eager=true or a "
        "lower optim.micro_batch",
        gpu=True,
    ),
]


def _recompute(model, prompt: list[int], tokens: list[int]) -> torch.Tensor:
    """log p(token) of `tokens` after `prompt`, one uncached HF forward pass (fp32)."""
    import torch

    device = next(model.parameters()).device
    ids = torch.tensor([prompt + tokens], device=device)  # [1, Lp + Lc]
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1 : -1].float()  # [Lc, V]
    logp = torch.log_softmax(logits, dim=-1)
    return logp.gather(-1, torch.tensor(tokens, device=device)[:, None]).squeeze(-1).cpu()  # [Lc]


def _hf(path: Path, device: str, bf16: bool = False):
    """The HF model of `path` in fp32 (`bf16`: its weights rounded to bf16 first, as a bf16 engine loads them)."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16 if bf16 else torch.float32)
    return model.float().to(device).eval()


def _max_err(model, groups, prompts) -> float:
    import torch

    err = 0.0
    for prompt, group in zip(prompts, groups):
        for c in group:
            if c.token_ids:
                want = _recompute(model, prompt, list(c.token_ids))
                err = max(err, float((torch.tensor(c.logprobs) - want).abs().max()))
    return err


def hf_sampling(folder: Path) -> Row:
    from rollout.engines.base import SamplingParams
    from rollout.engines.hf_engine import HFEngine

    device = "cuda" if cuda() is None else "cpu"
    path = tiny_model(folder / "model-v0")
    engine = HFEngine(str(path), dtype="float32", device=device)
    t0 = time.perf_counter()
    groups = engine.generate(PROMPTS, SamplingParams(n=2, max_new_tokens=24, seed=7))
    seconds = time.perf_counter() - t0
    tokens = sum(len(c.token_ids) for g in groups for c in g)
    err = _max_err(engine.model, groups, PROMPTS)
    figures = {"device": device, "tokens_per_s": round(tokens / seconds, 1), "max_logprob_err": err}
    engine.close()
    if err > LOGPROB_TOL["float32"]:
        return Row("engine.hf_sampling", "fail", f"log-probs differ from the recompute by {err:.2g}", figures)
    return Row("engine.hf_sampling", "pass", "", figures)


class VllmChecks:
    """One vLLM engine (sleep mode, in-flight updates, CUDA graphs) for the three vLLM checks, then the recomputes."""

    def __init__(self, folder: Path):
        self.v0, self.v1 = tiny_model(folder / "model-v0"), tiny_model(folder / "model-v1", seed=1)

    def run(self, check) -> None:
        import torch

        from rollout.engines.vllm_engine import VLLMEngine

        free0 = torch.cuda.mem_get_info()[0]
        engine = VLLMEngine(
            str(self.v0),
            dtype="bfloat16",
            seed=0,
            sleep_mode=True,
            inflight_updates=True,
            enforce_eager=False,
            gpu_memory_utilization=0.25,
            max_model_len=256,
            max_num_seqs=32,
        )
        self.engine, self.free0, self.built = engine, free0, torch.cuda.mem_get_info()[0]
        try:
            check("engine.vllm_sampling", self.sampling)
            check("engine.vllm_inflight", self.inflight)
            check("engine.vllm_sleep", self.sleep)
        finally:
            engine.close()

    def sampling(self) -> Row:
        from rollout.engines.base import SamplingParams

        cg = str(getattr(self.engine.llm.llm_engine.vllm_config.compilation_config, "cudagraph_mode", "unknown"))
        t0 = time.perf_counter()
        groups = self.engine.generate(PROMPTS, SamplingParams(n=4, max_new_tokens=64, seed=7))
        seconds = time.perf_counter() - t0
        tokens = sum(len(c.token_ids) for g in groups for c in g)
        err = _max_err(_hf(self.v0, "cuda", bf16=True), groups, PROMPTS)
        figures = {
            "cudagraph_mode": cg,
            "tokens_per_s": round(tokens / seconds, 1),
            "max_logprob_err": err,
            "engine_gib": round((self.free0 - self.built) / 2**30, 2),
        }
        if "NONE" in cg.upper():
            return Row("engine.vllm_sampling", "fail", "CUDA graphs are off (enforce_eager was asked False)", figures)
        if err > LOGPROB_TOL["bfloat16"]:
            return Row("engine.vllm_sampling", "fail", f"log-probs differ from the recompute by {err:.2g}", figures)
        return Row("engine.vllm_sampling", "pass", "", figures)

    def inflight(self) -> Row:
        import torch
        from safetensors.torch import load_file

        from rollout.engines.base import SamplingParams

        engine = self.engine
        new = load_file(str(self.v1 / "model.safetensors"))
        for i, prompt in enumerate(PROMPTS[:2]):
            engine.add(prompt, SamplingParams(n=2, max_new_tokens=32, prompt_seeds=(11 + i,)), i)
        done, update_ms = {}, None
        for step in range(400):
            if step == UPDATE_AFTER:
                t0 = time.perf_counter()
                engine.update_weights(new, engine.weight_version + 1)
                update_ms = (time.perf_counter() - t0) * 1e3
            done.update(engine.step())
            if not engine.pending():
                break
        old_model, new_model = _hf(self.v0, "cuda", bf16=True), _hf(self.v1, "cuda", bf16=True)
        v = engine.weight_version
        worst_before = worst_after = 0.0
        changed: list[float] = []  # per sample past the boundary: mean |log-prob - the old weights'|
        problems = []
        for key, group in done.items():
            for c in group:
                if c.versions == [(0, v - 1)] and len(c.token_ids) <= UPDATE_AFTER + 2:
                    continue  # ended (EOS) before the update reached it
                if len(c.versions) != 2 or c.versions[1][1] != v:
                    problems.append(f"versions {c.versions} for {len(c.token_ids)} tokens")
                    continue
                b = c.versions[1][0]
                got = torch.tensor(c.logprobs)
                old = _recompute(old_model, PROMPTS[key], list(c.token_ids))
                now = _recompute(new_model, PROMPTS[key], list(c.token_ids))
                worst_before = max(worst_before, float((got[:b] - old[:b]).abs().max()))
                worst_after = max(worst_after, float((got[b:] - now[b:]).abs().max()))
                changed.append(float((got[b:] - old[b:]).abs().mean()))
        figures = {
            "update_ms": round(update_ms or -1, 1),
            "crossed": len(changed),
            "err_before": worst_before,
            "err_after": worst_after,
            "old_vs_new_after": min(changed, default=0.0),
        }
        tol = LOGPROB_TOL["bfloat16"]
        if problems or update_ms is None or len(changed) < 2:
            return Row(
                "engine.vllm_inflight",
                "fail",
                "; ".join(problems[:3]) or f"{len(changed)} samples ran past the update (nothing in flight?)",
                figures,
            )
        if worst_before > tol or worst_after > tol or min(changed) < SWITCH * tol:
            return Row(
                "engine.vllm_inflight",
                "fail",
                "log-probs do not switch from the old weights to the new ones at the version boundary",
                figures,
            )
        return Row("engine.vllm_inflight", "pass", "", figures)

    def sleep(self) -> Row:
        import torch

        from rollout.engines.base import SamplingParams
        from stare.plan.colocation import SLEEP_RESIDUAL

        engine, params = self.engine, SamplingParams(n=2, max_new_tokens=32, seed=3)
        before = engine.generate(PROMPTS, params)
        t0 = time.perf_counter()
        engine.sleep()
        torch.cuda.empty_cache()
        sleep_s = time.perf_counter() - t0
        asleep = torch.cuda.mem_get_info()[0]
        t0 = time.perf_counter()
        engine.wake()
        wake_s = time.perf_counter() - t0
        after = engine.generate(PROMPTS, params)
        residual = self.free0 - asleep  # what the engine keeps on the GPU asleep (this process's view)
        figures = {
            "residual_gib": round(residual / 2**30, 3),
            "plan_gib": round(SLEEP_RESIDUAL / 2**30, 3),
            "freed_gib": round((asleep - self.built) / 2**30, 3),
            "sleep_s": round(sleep_s, 2),
            "wake_s": round(wake_s, 2),
        }
        same = all(a.token_ids == b.token_ids for ga, gb in zip(before, after) for a, b in zip(ga, gb))
        if not same:
            return Row("engine.vllm_sleep", "fail", "samples after the wake differ from before the sleep", figures)
        if residual > SLEEP_RESIDUAL:
            return Row(
                "engine.vllm_sleep",
                "fail",
                f"asleep the engine keeps {residual / 2**30:.2f} GiB, more than the "
                f"{SLEEP_RESIDUAL / 2**30:.2f} GiB stare plan counts",
                figures,
            )
        return Row("engine.vllm_sleep", "pass", "", figures)


def run(ctx: Context, report) -> None:
    check = timed(report)
    folder = Path(ctx.out) / "models"
    check("engine.hf_sampling", lambda: hf_sampling(folder))
    why = cuda() or missing("vllm")
    if why:
        for name in ("engine.vllm_sampling", "engine.vllm_inflight", "engine.vllm_sleep"):
            report(
                Row(
                    name,
                    "skip",
                    why
                    + (
                        ""
                        if cuda()
                        else " (the lent GPU images carry no vLLM: its 326 MB wheel is over what can be carried)"
                    ),
                )
            )
        return
    VllmChecks(folder).run(check)
