"""The two modes are one algorithm: for the same seed and config, strictly on-policy, one rollout and
one reward worker and the rollout batch equal to a step's prompts, `stare up` (every role its own
process, Redis streams, a gloo weight broadcast) trains the same trajectories and logs the same
metrics as `stare train` (one process, in-memory seams), and ends with the same weights.

Also with the learner as 2 ranks (`system.learner_ranks: 2`: `stare learner` starts its second rank
as a process; rank 0 hands it whole groups of each step) under ZeRO-3 (the weights for the rollout
worker gathered parameter by parameter on both ranks): 2 ranks give the one-rank step metrics and
weights (1e-5). And node-colocated (`system.colocate: on`: no rollout worker; each of the 2 ranks hosts
a transformers engine, asleep while the learner steps, woken by rank 0's SAMPLE op to sample its share of
each round with its own learner's weights, gathered on both ranks under ZeRO-3; the held-out evaluation
spread over both engines by the EVALUATE op, rank 0 scoring): the same trajectories, metrics, evaluations and weights as `stare train`, so also as the
2-rank run with a rollout worker process (the case above, same tolerance)."""

from __future__ import annotations

import io
import json
import threading
from pathlib import Path

import pytest
from redis_fixtures import have_redis_server
from safetensors.torch import load_file

from stare.app.launch.embedded import run_training
from stare.app.launch.processes import ProcessLauncher as Launcher
from stare.app.launch.run_folder import prepare_run
from stare.config import build_config

pytestmark = [
    pytest.mark.slow,
    pytest.mark.redis,
    pytest.mark.skipif(not have_redis_server(), reason="redis-server is not installed"),
]

STEPS = 3
COMPARED = (
    "entropy",
    "loss",
    "reward_mean",
    "gate",
    "w",
    "m",
    "clip_fraction",
    "response_length_mean",
    "train_tokens",
    "groups",
)
EVAL_PROBLEMS = 4
EVAL_COMPARED = ("greedy_accuracy", "pass_at_k", "avg_at_k", "per_level", "per_source")


def _config(
    model_dir: Path,
    out: Path,
    name: str,
    *,
    learner_ranks: int = 1,
    zero_stage: int = 1,
    streaming: bool = False,
    colocate: str = "auto",
):
    return build_config(
        {
            "run": {"name": name, "output_dir": str(out), "steps": STEPS, "checkpoint_every": 10, "threads": 1},
            "model": {"path": str(model_dir)},
            "task": {"eval_problems": EVAL_PROBLEMS, "eval_every": 1000, "eval_k": 2, "final_eval_k": 3},
            "rollout": {"prompts_per_step": 3, "samples_per_prompt": 4, "max_new_tokens": 12},
            "data": {"dynamic_sampling": True, "max_sampling_rounds": 10},
            "optim": {"lr": 3e-4, "micro_batch": 6, "zero_stage": zero_stage},
            # the gate on (target above any entropy here) and the sign schedule moving W and M every step
            "controller": {
                "target": 5.0,
                "schedule": "sign",
                "alpha": 0.5,
                "w_max": 10.0,
                "m_min": 0.1,
                "adaptive": True,
            },
            "system": {
                "max_staleness": 0,
                "rollout_batch_prompts": 3,
                "heartbeat_s": 0.5,
                "learner_ranks": learner_ranks,
                "broadcast_timeout_s": 20.0,
                "rollout_streaming": streaming,
                "colocate": colocate,
            },
            "control_plane": {"port": 0, "allow_unauthenticated": True, "serve_in_train": False},
        }
    )


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.fixture(scope="module")
def embedded_run(tiny_model_dir, tmp_path_factory) -> Path:
    return run_training(
        prepare_run(_config(tiny_model_dir, tmp_path_factory.mktemp("embedded"), "embedded"), None), progress=False
    )


def _weights(run_dir: Path) -> dict:
    return load_file(run_dir / "hf" / "model.safetensors")


def _assert_every_rank_sampled_and_slept_while_stepping(log: str, ranks: int) -> None:
    """From the learner's log: every rank took prompts in some SAMPLE op (rank 0's line per op lists what each
    rank took) and sampled its share of each held-out evaluation, and at the end each rank's engine had slept
    once per wake (asleep at every learner step: the rank checks it before each, `TrainsAsleep`) and was asleep
    at all of its STEPS steps."""
    import re

    taken = [
        [int(n) for n in m.group(1).split(",")]
        for m in re.finditer(
            r"waiting prompts at version \d+ in "
            r"[\d.]+ s \(by rank: \[([\d, ]+)\]\)",
            log,
        )
    ]
    assert taken and all(len(t) == ranks for t in taken)
    assert all(sum(t[r] for t in taken) > 0 for r in range(ranks)), taken
    ends = {
        int(m.group(1)): tuple(int(m.group(i)) for i in range(2, 7))
        for m in re.finditer(
            r"learner rank (\d+): colocated engine: (\d+) wakes, (\d+) sleeps;.*?; (\d+) held-out problems sampled in "
            r"(\d+) evaluations; (\d+) learner steps, the engine asleep at each",
            log,
        )
    }
    assert sorted(ends) == list(range(ranks)), log[-3000:]
    for rank, (wakes, sleeps, held_out, evaluations, steps) in ends.items():
        assert wakes == sleeps >= 1 and steps == STEPS, (rank, wakes, sleeps, steps)
        # the held-out evaluations (steps 0 and STEPS) are spread over the ranks (the EVALUATE op): each rank
        # samples problems r, r + ranks, ... of EVAL_PROBLEMS, woken once more for each
        assert evaluations == 2 and held_out == 2 * len(range(rank, EVAL_PROBLEMS, ranks)) > 0, (rank, ends)
        assert wakes == sum(1 for t in taken if t[rank]) + 2, (rank, ends, taken)


def _assert_same_weights(got: dict, want: dict, *, start: dict) -> None:
    """The same weights up to the order of float sums. Adam turns a gradient element that is ~0 under one
    reduction order and ~1e-9 under another into different steps of up to ~lr each, so with 2 ZeRO-3 ranks
    (gradients reduce-scattered) an element or two may land a fraction of lr apart on some CPUs (seen on an
    AMX Xeon: 1 of 16,384 elements of one tensor 2.6e-5 apart at lr 3e-4, every other element within 1e-6),
    while a wrong batch or a missed step moves whole tensors (and the step metrics, compared above, catch a
    mis-scaled gradient Adam would hide). So each tensor is within 1% of its own update's norm (seen: at most
    0.03%), and at most 1 element in 10,000 (model-wide) is more than 1e-5 apart."""
    off = total = 0
    for name, tensor in want.items():
        diff = (got[name].float() - tensor.float()).abs()  # [*shape]
        update = (tensor.float() - start[name].float()).norm()
        assert float(diff.norm()) <= 1e-2 * float(update) + 1e-6, (name, float(diff.norm()), float(update))
        off += int((diff > 1e-5).sum())
        total += tensor.numel()
    assert off <= total // 10_000, f"{off} of {total} elements more than 1e-5 apart"


@pytest.mark.parametrize(
    "learner_ranks,zero_stage,streaming,colocate",
    [(1, 1, False, "auto"), (2, 3, False, "auto"), (1, 1, True, "auto"), (2, 3, False, "on")],
    ids=["1-rank", "2-ranks-zero3", "1-rank-rollout-streaming", "2-ranks-zero3-colocated"],
)
def test_stare_up_trains_the_same_trajectories_with_the_same_metrics_and_weights_as_stare_train(
    embedded_run, tiny_model_dir, tmp_path, learner_ranks, zero_stage, streaming, colocate
):
    embedded = embedded_run
    cfg = _config(
        tiny_model_dir,
        tmp_path,
        "distributed",
        learner_ranks=learner_ranks,
        zero_stage=zero_stage,
        streaming=streaming,
        colocate=colocate,
    )
    log = io.StringIO()
    colocated = colocate == "on"  # no rollout worker: the learner ranks sample
    launcher = Launcher(cfg, rollout=0 if colocated else 1, reward=1, out=log, color=False, grace_s=30, control=False)
    launcher.start()
    code: list[int] = []
    thread = threading.Thread(target=lambda: code.append(launcher.supervise(poll_s=0.2)), daemon=True)
    thread.start()
    thread.join(timeout=420)
    finished = not thread.is_alive()  # else stop() below ends supervise() with 0 and nothing trained
    launcher.stop()
    assert finished, "stare up did not finish within 420 s:\n" + log.getvalue()[-4000:]
    assert code == [0], log.getvalue()[-4000:]
    assert {n: r.exits for n, r in launcher.roles.items() if r.exits} == {"learner": [0]}, log.getvalue()[-4000:]
    distributed = cfg.run_dir
    if learner_ranks > 1:
        assert "following rank 0" in log.getvalue() and f"said stop after {STEPS} steps" in log.getvalue()
    if colocated:
        assert not any(name.startswith("rollout") for name in launcher.roles)
        _assert_every_rank_sampled_and_slept_while_stepping(log.getvalue(), learner_ranks)

    trained_e = [r["ids"] for r in _lines(embedded / "trained.jsonl")]
    trained_d = [r["ids"] for r in _lines(distributed / "trained.jsonl")]
    assert len(trained_e) == STEPS and trained_d == trained_e  # the same trajectories, step by step
    metrics_e, metrics_d = _lines(embedded / "metrics.jsonl"), _lines(distributed / "metrics.jsonl")
    assert [m["step"] for m in metrics_d] == [m["step"] for m in metrics_e] == list(range(1, STEPS + 1))
    assert any(m["gate"] for m in metrics_e) and len({m["w"] for m in metrics_e}) > 1  # the controller moved
    for e, d in zip(metrics_e, metrics_d):
        for key in COMPARED:
            assert d[key] == pytest.approx(e[key], abs=1e-5, rel=1e-5), (e["step"], key, e[key], d[key])
    weights_e, weights_d = _weights(embedded), _weights(distributed)
    assert weights_d.keys() == weights_e.keys()
    _assert_same_weights(weights_d, weights_e, start=load_file(tiny_model_dir / "model.safetensors"))
    # held-out: in process for `stare train` (on every rank's engine when colocated), through the streams
    # (rollout and reward workers) for `stare up`; the same problems, seeds and weights give the same numbers
    evals_e, evals_d = _lines(embedded / "eval.jsonl"), _lines(distributed / "eval.jsonl")
    assert [r["step"] for r in evals_d] == [r["step"] for r in evals_e] == [0, STEPS]
    assert colocated or all(r["complete"] and r["missing_samples"] == 0 for r in evals_d)
    assert [r["k"] for r in evals_e] == [2, 3]  # the run's last evaluation samples task.final_eval_k
    for e, d in zip(evals_e, evals_d):
        assert {k: d[k] for k in ("k", *EVAL_COMPARED)} == {k: e[k] for k in ("k", *EVAL_COMPARED)}, (e, d)
