"""`build_tiny_model` (cached, atomic) and `stare build-model`."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from stare.models.tiny.measure import evaluate
from stare.models.tiny.spec import BUILD_VERSION, TinyModelSpec, default_model_dir
from stare.models.tiny.tokenizer import build_tokenizer
from stare.models.tiny.warm_start import _new_model, _warm_start


def build_tiny_model(
    out_dir: Path | str | None = None,
    task_name: str = "arithmetic",
    seed: int = 0,
    *,
    force: bool = False,
    verbose: bool = False,
    **spec_overrides: Any,
) -> Path:
    """Build (or reuse) the tiny model directory and return its path.

    `spec_overrides` are `TinyModelSpec` fields (e.g. `sft_max_steps=30, sft_target_accuracy=2.0`
    for a quick test build that learns next to nothing). `out_dir` defaults to `default_model_dir(spec)`. An existing directory is reused
    when its `build_info.json` has the same arguments hash (unless `force`); one with a different
    hash is rebuilt; a non-empty directory without `build_info.json` is refused rather than
    overwritten.
    """
    spec = TinyModelSpec(task_name=task_name, seed=seed, **spec_overrides)
    out = Path(out_dir) if out_dir is not None else default_model_dir(spec)
    if not force and _matching_build(out, spec):
        return out
    if out.exists() and any(out.iterdir()) and not (out / "build_info.json").exists():
        raise FileExistsError(
            f"{out} is a non-empty directory without build_info.json; refusing to overwrite it "
            "(pass an empty or new directory)"
        )

    import torch

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # bitwise-reproducible builds, and polite on shared CPUs
    try:
        _build(spec, tmp, verbose=verbose)
        if force or not _matching_build(out, spec):  # else a concurrent builder finished first
            if out.exists():
                shutil.rmtree(out)
            os.replace(tmp, out)
    finally:
        torch.set_num_threads(threads)
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def _matching_build(out: Path, spec: TinyModelSpec) -> bool:
    try:
        info = json.loads((out / "build_info.json").read_text())
    except (OSError, ValueError):
        return False
    return info.get("args_hash") == spec.args_hash() and (out / "model.safetensors").exists()


def _build(spec: TinyModelSpec, out: Path, *, verbose: bool) -> None:
    import torch
    from transformers.utils import logging as hf_logging

    from stare.data.tasks import build_task
    from stare.data.tasks.base import SupervisedTask

    t0 = time.perf_counter()
    task = build_task(spec.task_name)
    if not isinstance(task, SupervisedTask):
        raise TypeError(
            f"task {spec.task_name!r} cannot write reference solutions (no `solution` method); "
            "the tiny-model warm start needs a SupervisedTask"
        )
    train = task.problems("train", spec.sft_max_steps * spec.sft_batch_size, seed=spec.seed)
    val = task.problems("train", spec.n_val, seed=spec.seed + 1_000_003)
    test = task.problems("test", spec.n_eval, seed=spec.seed)

    corpus = [getattr(task, "alphabet", "")]
    corpus += [p.prompt + task.solution(p) for p in train[:1000]] + [p.prompt for p in test]
    tokenizer = build_tokenizer(corpus, whole_tokens=getattr(task, "whole_tokens", ()))
    torch.manual_seed(spec.seed)
    model = _new_model(spec, tokenizer)
    log = _warm_start(model, tokenizer, task, train, val, spec, verbose=verbose)
    t_train = time.perf_counter() - t0

    result = evaluate(model, tokenizer, task, test, seed=spec.seed)
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # no "Writing model shards" bar for a one-file model
    try:
        model.save_pretrained(out)
    finally:
        if bars:
            hf_logging.enable_progress_bar()
    tokenizer.save_pretrained(out)
    info = {
        "build_version": BUILD_VERSION,
        "args_hash": spec.args_hash(),
        "spec": dataclasses.asdict(spec),
        "num_parameters": sum(p.numel() for p in model.parameters()),
        "vocab_size": len(tokenizer),
        "sft_steps": log["steps"],
        "sft_log": log["history"],
        "train_seconds": round(t_train, 2),
        "build_seconds": round(time.perf_counter() - t0, 2),
        "torch_version": torch.__version__,
        "recommended_max_new_tokens": 40,
        "eval": dataclasses.asdict(result),
    }
    (out / "build_info.json").write_text(json.dumps(info, indent=2) + "\n")
    if verbose:
        print(json.dumps({k: v for k, v in info.items() if k != "sft_log"}, indent=2))


def main(argv: Sequence[str] | None = None) -> int:
    """`stare build-model`: build (or reuse) the tiny model and print its directory."""
    parser = argparse.ArgumentParser(
        prog="stare build-model",
        description="Build the tiny Qwen2 policy + tokenizer for the embedded CPU demo (cached).",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="model directory (default: $STARE_CACHE_DIR/models/tiny-<task>-<hash>, "
        "STARE_CACHE_DIR defaulting to ~/.cache/stare)",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of data, init and warm start")
    parser.add_argument("--task", default="arithmetic", help="registered task name")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="FIELD=VALUE",
        help="override a TinyModelSpec field, e.g. --set sft_max_steps=100",
    )
    parser.add_argument("--force", action="store_true", help="rebuild even if a matching build exists")
    parser.add_argument("--quiet", action="store_true", help="print only the directory")
    args = parser.parse_args(argv)

    fields = {f.name: f for f in dataclasses.fields(TinyModelSpec)}
    overrides: dict[str, Any] = {}
    for item in args.set:
        name, sep, value = item.partition("=")
        if not sep or name not in fields or name in ("task_name", "seed"):
            valid = ", ".join(n for n in fields if n not in ("task_name", "seed"))
            parser.error(f"--set {item!r}: expected FIELD=VALUE with FIELD one of: {valid}")
        kind = type(getattr(TinyModelSpec(), name))
        try:
            overrides[name] = kind(value)
        except ValueError:
            parser.error(f"--set {item!r}: {name} must be a {kind.__name__}")

    path = build_tiny_model(
        args.out, task_name=args.task, seed=args.seed, force=args.force, verbose=not args.quiet, **overrides
    )
    if not args.quiet:
        info = json.loads((path / "build_info.json").read_text())
        ev = info["eval"]
        print(
            f"params {info['num_parameters']}  sft steps {info['sft_steps']}  "
            f"build {info['build_seconds']} s  held-out greedy accuracy {ev['greedy_accuracy']}  "
            f"sampling entropy {ev['sample_entropy']} nats/token"
        )
    print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
