"""`stare sim` runs the product's code where the product decides: which worker streams, what the pre-pass store
keeps, when a stream refuses a publish. Each test compares the sim's behaviour with the product's rule (a table
written from its docs) or its object, so a private copy that drifts fails here."""

from __future__ import annotations

import ast
import importlib
import inspect
from pathlib import Path

import pytest
from sim_helpers import TINY, tiny

from stare.config import ConfigError

# rollout.streaming.streaming_enabled's documented rule: system.rollout_streaming (None: on for the vllm engine
# or with in-flight weight updates, off for hf), never with the tool loop
STREAMING = [
    # engine, rollout_streaming, in-flight (max_staleness 1), tool use -> streams
    ("hf", None, False, False, False),
    ("hf", None, True, False, True),  # the case the sim's old copy got wrong
    ("hf", True, False, False, True),
    ("hf", False, False, False, False),
    ("vllm", None, False, False, True),
    ("vllm", False, False, False, False),
    ("vllm", None, False, True, False),  # the tool loop samples in batches (the old copy streamed)
    ("hf", True, False, True, False),
]


@pytest.mark.parametrize("engine, streaming, inflight, tools, streams", STREAMING)
def test_the_sim_streams_exactly_when_the_product_would(engine, streaming, inflight, tools, streams):
    from stare.app.sim.design import build_design, gpu_costs, lengths_of
    from stare.app.sim.node import SimNode

    over = [
        f"rollout.engine={engine}",
        f"system.rollout_streaming={'null' if streaming is None else str(streaming).lower()}",
        f"system.inflight_weight_updates={str(inflight).lower()}",
        f"system.max_staleness={1 if inflight else 0}",
        f"rollout.tool_use.enabled={str(tools).lower()}",
    ]
    try:
        cfg, sim = tiny(over)
    except ConfigError as err:  # a combination the config refuses is not a design
        pytest.skip(str(err))
    design = build_design(cfg, sim, gpus=2, learner_gpus=1, colocated=False)
    node = SimNode(cfg, design, gpu_costs(cfg, sim, design, TINY, "h100-80gb"), lengths_of(cfg, sim), prompt_len=1)
    assert design.streaming == streams
    assert [w.loop is not None for w in node.workers] == [streams]


def test_prepared_rows_follow_the_products_prepass_store():
    """A trajectory pre-passed at this version counts as prepared only if its response still has the length
    it had then (PrepassStore.get's rule): the step is charged the pre-pass of the rest."""
    from types import SimpleNamespace

    from stare.app.sim.lanes import Lane
    from stare.app.sim.learner import SimLearner

    cfg, _ = tiny()
    lane = Lane("learner", [0])
    learner = SimLearner(cfg, lane, lambda ts: 10.0, 0.0, 0.0, prepass_s=lambda ts: 1.0 * len(ts))

    def traj(tid, n):
        return SimpleNamespace(trajectory_id=tid, response_token_ids=[1] * n, prompt_token_ids=[1], loss_mask=[1] * n)

    learner.prepare([traj("a", 5), traj("b", 5)])  # 2 s on the lane
    learner.train_step([traj("a", 5), traj("b", 6), traj("c", 5)])  # only "a" is prepared: 10 - 1 s
    assert lane.now == pytest.approx(2.0 + 9.0)
    learner.train_step([traj("a", 5)])  # the weights moved on: nothing is prepared any more
    assert lane.now == pytest.approx(11.0 + 10.0)


def test_a_timed_stream_refuses_a_publish_past_the_products_bound():
    from stare.app.sim.streams import TimedStream
    from stare.runtime.process import stream_backlog
    from stare.transport.redis_streams import BackpressureError

    cfg, _ = tiny(["system.max_backlog=5", "run.checkpoint_every=1"])
    bound = stream_backlog(cfg)
    assert bound == 5 + (1 + 0 + 2) * 16 * 8  # max_backlog + (checkpoint_every + staleness + 2) x rows
    stream = TimedStream("raw", lambda: 0.0, bound)
    stream.publish(list(range(bound)))
    with pytest.raises(BackpressureError):
        stream.publish([1])
    assert stream.backlog() == bound  # nothing written by the refused publish


PRODUCT = ["rollout.streaming", "learner.process.colocation", "learner.step.prepass_store", "stare.config.colocation"]


def test_no_sim_module_defines_a_function_the_product_already_has():
    """A crude guard beside the behavioural tables: no function or class of stare/app/sim has the name of a
    public function or class of the product modules the sim runs."""
    names = set()
    for mod in PRODUCT:
        m = importlib.import_module(mod)
        names |= {n for n, o in vars(m).items() if not n.startswith("_") and getattr(o, "__module__", None) == mod}
    sim = Path(inspect.getfile(importlib.import_module("stare.app.sim.node"))).parent
    for path in sim.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                assert node.name.lstrip("_") not in names, f"{path.name} defines {node.name}, a product name"


@pytest.mark.parametrize(
    "setting, message",
    [
        ("rollout.engine.tensor_parallel_size=2", "tensor_parallel_size is 2: set it to 1"),
        ("rollout.tool_use.enabled=true", "does not run the tool loop"),
    ],
)
def test_a_colocated_design_the_product_refuses_exits_2_with_its_message(setting, message, capsys):
    """The sim builds its colocated node with the product's NodeRollout, so check_node_colocation refuses what
    the product refuses (the old private model simulated it)."""
    import argparse

    from stare.app.sim import command

    parser = argparse.ArgumentParser()
    command.add_parser(parser.add_subparsers())
    argv = ["sim", "--config", "configs/tiny-cpu.yaml", "--gpus", "2", "--colocated", "--corner", "central"]
    argv += ["--set", "rollout.engine=vllm", "--set", setting]
    args = parser.parse_args(argv)
    assert args.fn(args) == 2
    assert message in capsys.readouterr().err


def test_the_colocated_node_runs_the_products_sample_pump():
    """4 ranks, 32 prompts a step: every step is one SAMPLE op of the product's SamplePump, in which every rank
    takes its share (8) and its Colocation wakes the engine once and puts it back to sleep once."""
    from stare.app.sim.design import build_design, gpu_costs, lengths_of, simulate

    cfg, sim = tiny(["rollout.engine=vllm", "rollout.prompts_per_step=32", "sim.response_sigma=0.5"])
    design = build_design(cfg, sim, gpus=4, learner_gpus=None, colocated=True)
    run, summary = simulate(
        cfg, sim, design, gpu_costs(cfg, sim, design, TINY, "h100-80gb"), lengths_of(cfg, sim), steps=2, warmup=1
    )
    steps = len(run.metrics)
    assert steps == 4 and len(run.colocation_events) == 4
    assert all(e["wakes"] == steps and e["sleeps"] == steps for e in run.colocation_events)
    busy = [sum(b.values()) for b in summary["gpu_busy"].values()]
    assert max(busy) - min(busy) < 0.25  # the ranks share the round (one thread at a time, earliest clock first)


def test_stare_sim_colocated_runs_in_a_fresh_process():
    """In a process that never built a learner (no default torch.distributed group, unlike this test process
    once a learner test ran), `stare sim --colocated` runs: its ranks show progress on a local board, not the
    learner's store (it failed so outside the suite: 'Default process group has not been initialized')."""
    import subprocess
    import sys

    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "stare.app.cli",
            "sim",
            "--gpus",
            "2",
            "--colocated",
            "--corner",
            "central",
            "--steps",
            "2",
        ]
        + ["--set", "rollout.engine=vllm", "--set", "rollout.prompts_per_step=8", "--set", "sim.response_mean=20"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "2 GPUs: colocated" in out.stdout and "tokens/s/GPU" in out.stdout
