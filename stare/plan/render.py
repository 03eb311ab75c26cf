"""The memory plan as text (`stare plan`) and as JSON (`stare plan --json`)."""

from __future__ import annotations

import json

from stare.plan.gpu_memory import GIB, Plan


def _count(n: int) -> str:
    return next(
        f"{n / div:.3g}{unit}" for div, unit in ((1e9, "B"), (1e6, "M"), (1e3, "K"), (1, "")) if n >= div or div == 1
    )


def _gib(n: int) -> str:
    return f"{n / GIB:8.2f} GiB"


def render(plan: Plan) -> str:
    m = plan.model
    lines = [
        f"model: {_count(m.params)} params ({m.params:,}), {m.layers} layers, hidden {m.hidden}, heads {m.heads}/"
        f"{m.kv_heads} kv, intermediate {m.intermediate}, vocab {m.vocab:,}, {plan.dtype}  [{m.source}]",
        f"sequence: {plan.prompt_tokens:,} prompt [{plan.prompt_source}] + {plan.seq_tokens - plan.prompt_tokens:,} "
        f"response = {plan.seq_tokens:,} tokens",
    ]
    if plan.checkpoint:
        c = plan.checkpoint
        lines.append(
            f"checkpoints: {c['bytes'] / 1e9:,.1f} GB each (fp32 master + Adam moments), every {c['every']} "
            f"steps, {c['keep']} kept: {c['peak_bytes'] / 1e9:,.0f} GB on disk while the next is written"
            + (
                f", {c['written_bytes'] / 1e12:,.1f} TB written over the run"
                if c["written_bytes"] is not None
                else " (run.steps from data.epochs: the total is known at start)"
            )
        )
    gpus = plan.roles[0].gpus if plan.roles else 1
    scope = "one GPU" if gpus == 1 else f"each of {gpus} GPUs"
    if plan.how:
        lines += [
            "",
            "one GPU, colocated (stare train):"
            if gpus == 1
            else f"{gpus} GPUs, each a learner rank hosting a rollout engine (stare up, system.colocate on):",
        ]
    for r in plan.roles:
        where = (
            f"{r.gpus} x {r.gpu_mem_bytes / GIB:.0f} GiB GPU" + ("s" if r.gpus > 1 else "")
            if r.role == "learner"
            else f"1 x {r.gpu_mem_bytes / GIB:.0f} GiB GPU per worker ({r.extra['engine']})"
        )
        lines += ["", f"{r.title}, per GPU:" if r.title else f"{r.role} ({where}), per GPU:"]
        lines += [f"  {i.name:<16}{_gib(i.bytes)}   {i.note}" for i in r.items]
        verdict = "fits" if r.fits else "DOES NOT FIT"
        lines.append(
            f"  {'total':<16}{_gib(r.total)}   of {_gib(r.usable).strip()} usable "
            f"({r.usable / r.gpu_mem_bytes:.0%} of {r.gpu_mem_bytes / GIB:.0f} GiB): {verdict}"
        )
        if r.role == "learner":
            x = r.extra
            lines.append(
                f"  activations: {_gib(x['activations_no_checkpointing']).strip()} without gradient "
                f"checkpointing, {_gib(x['activations_checkpointing']).strip()} with it"
            )
            lines.append(
                "  model states per ZeRO stage: "
                + ", ".join(f"{s}: {v['bytes'] / GIB:.1f} GiB" for s, v in plan.zero_stages.items())
            )
        lines += [f"  note: {n}" for n in r.notes]
        lines += [f"  change: {f}" for f in r.fixes]
    if plan.how:
        lines += [""] + [f"how: {h}" for h in plan.how]
        lines += ["", f"fits on {scope}, colocated" if plan.fits else f"does not fit on {scope} (see 'change:')"]
    else:
        lines += ["", "all roles fit" if plan.fits else "some role does not fit (see 'change:')"]
    return "\n".join(lines)


def render_json(plan: Plan) -> str:
    return json.dumps(plan.to_json(), indent=1, default=str)
