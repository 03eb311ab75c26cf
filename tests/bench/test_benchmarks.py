"""Each benchmark of `stare bench` at a tiny size, so none rots: complete rows with finite,
positive figures (not that targets are met: a unit test cannot promise a speed)."""

import importlib.util

import pytest
import torch
from bench_helpers import check_rows
from redis_fixtures import have_redis_server


def needs_redis(test):
    """A real redis-server on a free port: marked `redis`, skipped without one on PATH."""
    return pytest.mark.redis(pytest.mark.skipif(not have_redis_server(), reason="needs redis-server on PATH")(test))


def test_loss_times_stare_and_grpo_from_logits_and_from_logprobs():
    from stare.app.bench.bench_loss import measure

    rows = check_rows(measure(seqs=4, length=16, vocab=32, micro_batch=2, repeats=2), ["loss", "loss/elementwise"])
    assert rows["loss"]["target"] == 1.03 and rows["loss"]["higher_is_better"] is False
    assert rows["loss"]["unit"] == "s" and rows["loss"]["repeats"] == 2


@needs_redis
def test_transport_compares_each_size_codec_and_direction_with_raw_redis_py():
    from stare.app.bench.bench_transport import measure

    rows = measure(rounds=2, batch=4, mb=0.02, sizes=(64,))
    check_rows(rows, [f"transport/0k/{c}/{d}" for c in ("bytes", "Trajectory") for d in ("publish", "consume+ack")])
    assert all(r["unit"] == "records/s" and r["target"] == 0.95 and r["records"] % 4 == 0 for r in rows)
    assert all(r["repeats"] == 2 and r["pairs"] == 2 * r["records"] // 4 for r in rows)  # one pair per batch


@pytest.mark.slow
def test_broadcast_compares_the_publisher_with_a_raw_gloo_loop():
    from stare.app.bench.bench_broadcast import measure

    (r,) = check_rows(measure(params_m=1.0, receivers=1, rounds=1), ["broadcast"]).values()
    assert r["unit"] == "GB/s" and r["target"] == 0.95
    assert len(r["samples"]["ours"]) == len(r["samples"]["baseline"]) == len(r["seconds"]["ours_s"]) == 1


@pytest.mark.slow
@needs_redis
def test_overlap_runs_both_arms_of_stare_up(tiny_model_dir):
    from stare.app.bench.bench_overlap import measure

    extra = [
        f"model.path={tiny_model_dir}",
        "rollout.prompts_per_step=2",
        "rollout.samples_per_prompt=4",
        "rollout.max_new_tokens=16",
        "optim.micro_batch=4",
    ]
    (r,) = check_rows(measure(steps=4, warmup=2, repeats=1, extra=extra, arm_timeout_s=200), ["overlap"]).values()
    assert r["unit"] == "steps/min" and r["target"] == 1.5


@pytest.mark.slow
def test_the_overlaps_ideal_is_between_1_and_2(tiny_model_dir):
    """One learner and one rollout core: on-policy a step is rollout + learn, overlapped at least the
    larger of the two, so stare sim's ideal ratio lies in [1, (R + L) / max(R, L)] within [1, 2]."""
    from stare.app.bench.bench_overlap import sim_ideal

    extra = [
        f"model.path={tiny_model_dir}",
        "rollout.prompts_per_step=2",
        "rollout.samples_per_prompt=4",
        "rollout.max_new_tokens=16",
        "optim.micro_batch=4",
        "system.rollout_batch_prompts=1",
    ]
    assert 1.0 <= sim_ideal(extra, timeout_s=300) <= 2.0


@needs_redis
def test_rollout_worker_and_bare_engine_sample_the_same_tokens(tiny_model_dir):
    from stare.app.bench.bench_rollout import measure

    rows = measure(repeats=2, model_path=tiny_model_dir, prompts=2, samples=2, max_new_tokens=8)
    by_name = check_rows(rows, ["rollout/hf", "rollout/vllm"])
    hf = by_name["rollout/hf"]
    assert hf["unit"] == "tokens/s" and hf["target"] == 0.9
    assert len(hf["tokens_per_round"]) == 2 and all(0 < n <= 2 * 2 * 8 for n in hf["tokens_per_round"])
    if importlib.util.find_spec("vllm") is None:
        assert "vLLM is not importable" in by_name["rollout/vllm"]["skipped"]


@pytest.mark.slow
def test_learner_and_plain_loop_take_the_same_first_step(tiny_model_dir):
    from stare.app.bench.bench_learner import measure

    overrides = [
        f"model.path={tiny_model_dir}",
        "rollout.prompts_per_step=2",
        "rollout.samples_per_prompt=4",
        "rollout.max_new_tokens=16",
        "optim.micro_batch=4",
    ]  # 2 micro-batches: accumulation too
    (r,) = check_rows(measure(repeats=2, overrides=overrides), ["learner"]).values()
    assert 0 < r["first_step_update"] and r["first_step_weight_drift"] <= 0.05 * r["first_step_update"]
    assert r["unit"] == "tokens/s" and r["target"] == 0.9


@pytest.mark.slow
def test_the_step_without_its_pre_pass_is_timed_against_the_step_with_it(tiny_model_dir):
    from stare.app.bench.bench_learner import measure_selection_keys

    overrides = [f"model.path={tiny_model_dir}", "rollout.prompts_per_step=2", "rollout.samples_per_prompt=4"]
    (r,) = check_rows(measure_selection_keys(repeats=2, overrides=overrides), ["learner-no-prepass"]).values()
    assert r["unit"] == "tokens/s" and r["target"] == 1.1 and r["repeats"] == 2


def test_synthetic_groups_are_whole_groups_with_mixed_rewards():
    from stare.app.bench.bench_learner import synthetic_groups

    ts = synthetic_groups(3, 4, vocab=50, max_response=16)
    assert len(ts) == 12 and len({t.group_id for t in ts}) == 3
    for g in {t.group_id for t in ts}:
        assert sorted(t.reward for t in ts if t.group_id == g) == [0.0, 0.0, 1.0, 1.0]
    assert all(1 <= len(t.response_token_ids) <= 16 and max(t.response_token_ids) < 50 for t in ts)


@pytest.mark.slow
def test_step_breakdown_partitions_the_step_time(tiny_model_dir):
    from stare.app.bench.bench_step import measure

    overrides = [
        f"model.path={tiny_model_dir}",
        "rollout.prompts_per_step=2",
        "rollout.samples_per_prompt=4",
        "rollout.max_new_tokens=16",
        "optim.micro_batch=4",
        "task.eval_k=2",
    ]
    rows = measure(steps=3, overrides=overrides)
    names = ["step/rollout", "step/weights in", "step/reward", "step/learn", "step/publish", "step/other"]
    check_rows(rows, names)
    total = rows[0]["baseline"]
    assert all(r["baseline"] == total and r["target"] is None for r in rows)
    assert sum(r["ours"] for r in rows) == pytest.approx(total, rel=1e-9)  # the pieces and `other` add up


def test_gpu_benchmarks_run_their_code_on_the_cpu_at_a_tiny_size():
    from stare.app.bench import bench_gpu as g

    tiny = dict(hidden=32, layers=2, heads=4, kv_heads=2, ffn=64, vocab=97)
    learner = g.measure_learner(
        device="cpu",
        shape=tiny,
        groups=2,
        group_size=4,
        max_response=12,
        prompt_len=6,
        micro_batch=4,
        repeats=1,
        dtype=torch.float32,
        matmul_n=128,
    )
    memory = g.measure_logprob_memory(device="cpu", tokens=16, hidden_size=8, vocab=97, repeats=1, dtype=torch.float32)
    from stare.app.bench.bench_gpu_generate import measure_generate

    generate = measure_generate(
        device="cpu", shape=tiny, prompts=2, samples=2, prompt_len=4, max_new_tokens=6, repeats=1, dtype="float32"
    )
    rows = check_rows(
        learner + memory + generate, ["gpu-learner", "gpu-logprob-memory", "gpu-logprob-time", "gpu-generate"]
    )
    assert rows["gpu-logprob-memory"]["skipped"] == "peak memory is measured on CUDA only"
    assert rows["gpu-learner"]["achieved_tflops"] > 0


def test_full_logprobs_reference_matches_the_learners_chunked_function():
    from learner.step.logprobs import chunked_logprobs_and_entropy
    from stare.app.bench.bench_gpu import full_logprobs_entropy

    g = torch.Generator().manual_seed(0)
    head = torch.nn.Linear(8, 40, bias=False)
    hidden, targets = torch.randn(12, 8, generator=g), torch.randint(0, 40, (12,), generator=g)
    ours = chunked_logprobs_and_entropy(head, hidden, targets, chunk_tokens=5)[:2]
    for a, b in zip(full_logprobs_entropy(head, hidden, targets), ours):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA present: the GPU benchmarks run for real")
def test_gpu_benchmarks_say_they_were_skipped_without_cuda():
    from stare.app.bench.registry import BENCHMARKS, SECTIONS

    for name in SECTIONS["gpu"]:
        (r,) = check_rows(BENCHMARKS[name].run(quick=True), [name]).values()
        assert "no CUDA device" in r["skipped"]
