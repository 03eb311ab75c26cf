"""Builders shared by the learner tests (not a test module): a small random causal LM on disk and
scored trajectories with long-tailed lengths."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import torch

from stare.transport.records import Trajectory

VOCAB = 97
# a step small enough for a CPU test: 3 groups of 4 in micro-batches of 5 (accumulation and a cut group),
# a learning rate that moves the random model visibly, no clipping in the way, one process without ZeRO
SMALL_STEP = [
    "rollout.prompts_per_step=3",
    "rollout.samples_per_prompt=4",
    "optim.micro_batch=5",
    "optim.lr=1e-3",
    "optim.grad_clip=1000",
    "optim.zero_stage=0",
]


def random_qwen2(seed: int = 0, vocab: int = VOCAB, hidden: int = 32, layers: int = 2, dtype=torch.float32):
    """A randomly initialised Qwen2 causal LM (sdpa attention), small enough for a CPU test."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=vocab,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=2 * hidden,
        max_position_embeddings=256,
        tie_word_embeddings=False,
        initializer_range=0.2,
        pad_token_id=0,
        eos_token_id=1,
        attn_implementation="sdpa",
    )
    return Qwen2ForCausalLM(config).to(dtype)


def flat_weights(learner, dtype: torch.dtype | None = torch.float64) -> torch.Tensor:
    """The learner's parameters in one new 1-D tensor (in `dtype`; None: their own)."""
    return torch.cat([p.detach().reshape(-1).to(dtype or p.dtype) for p in learner.engine.module.parameters()])


def build_learner(model_dir: Path, overrides):
    """A one-process `Learner` of the default config with `overrides` on the model in `model_dir`."""
    from learner.step.trainer import Learner
    from stare.config import build_config

    return Learner(build_config({}, overrides=list(overrides)), model_dir, pad_id=0)


def save_random_qwen2(path: Path, seed: int = 0) -> Path:
    random_qwen2(seed).save_pretrained(path)
    return path


def trajectories(
    seed: int,
    groups: int = 3,
    group_size: int = 4,
    max_prompt: int = 6,
    max_response: int = 20,
    first_tokens: tuple[int, ...] | None = None,
) -> list[Trajectory]:
    """Scored trajectories: mixed rewards inside each group, lengths drawn from a long tail."""
    rng = np.random.default_rng(seed)
    out = []
    for g in range(groups):
        for s in range(group_size):
            p = int(rng.integers(1, max_prompt + 1))
            r = int(min(max_response, 1 + rng.pareto(1.2) * 3))
            response = rng.integers(2, VOCAB, r).astype(np.int32)
            if first_tokens is not None:
                response[0] = first_tokens[len(out) % len(first_tokens)]
            mask = np.ones(r, dtype=np.uint8)
            if r > 3:
                mask[1] = 0  # a tool-output token: masked out of the loss
            out.append(
                Trajectory(
                    run_id="t",
                    trajectory_id=f"{seed}-{g}-{s}",
                    group_id=f"{seed}-{g}",
                    group_size=group_size,
                    weight_version=0,
                    prompt_token_ids=rng.integers(2, VOCAB, p).astype(np.int32),
                    response_token_ids=response,
                    response_logprobs=-rng.random(r).astype(np.float32) * 3,
                    loss_mask=mask,
                    finish_reason="stop",
                    answer="",
                    problem_id=str(g),
                    data_source="t",
                    reward=float((s + g) % 2 if s < group_size - 1 else rng.random()),
                )
            )
    return out


def collate_rank_worker(rank: int, world: int, port: int, out_dir: str) -> None:
    """One gloo rank: collate its own trajectories (rank 1 has longer responses), gather the step's
    tokens and count STARE's L+ selection. Every rank's first response token has the same, highest
    surprisal, so a correct k = 1 selects exactly one of them. Also the same with the per-rank uids
    collate gave before the fix (rows numbered from 0 on every rank), the test's control."""
    import datetime

    import torch.distributed as dist

    from learner.algorithm.selection import in_topk
    from learner.algorithm.step_plan import StepTokens, plan_step
    from learner.engine.collectives import all_gather_ints, gather_step_tokens
    from learner.step.batch import collate
    from stare.config.algo import StareLossConfig

    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(seconds=60),
    )
    try:
        trajs = trajectories(10 + rank, groups=1, group_size=2)
        n = 3 + 4 * rank  # rank 0's responses have 3 tokens, rank 1's 7
        for t in trajs:
            t.response_token_ids = np.resize(t.response_token_ids, n)
            t.response_logprobs = np.resize(t.response_logprobs, n)
            t.loss_mask = np.ones(n, dtype=np.uint8)
        trajs[0].reward, trajs[1].reward = 1.0, 0.0  # row 0: A > 0, row 1: A < 0
        rows = 2
        width = max(r[0] for r in all_gather_ints([n], torch.device("cpu")))
        out = {}
        for name, first_row in (("global", rank * rows), ("per_rank", 0)):
            batch = collate(trajs, pad_id=0, rows=rows, first_row=first_row, width=width)
            old = torch.full(batch.mask.shape, -0.1)  # [S, L] surprisal 0.1 ...
            old[:, 0] = -5.0  # ... except each row's first token: 5 nats, equal on both ranks
            tokens = gather_step_tokens(
                StepTokens(old, torch.zeros_like(old), batch.advantages, batch.token_uid, batch.mask)
            )
            cfg = StareLossConfig(top_fraction=0.1)  # A > 0 tokens: 3 + 7 = 10 -> k = ceil(0.1 x 10) = 1
            ctx = plan_step(tokens, cfg, gate=1.0, w=2.0, m=1.0)
            positive = tokens.mask & (tokens.advantages > 0)
            selected = in_topk(-tokens.old_logprobs, tokens.token_uid, positive, ctx.pos_threshold)
            out[name] = {
                "selected": int(selected.sum()),
                "shape": tuple(batch.mask.shape),
                "first_uids": tokens.token_uid[:, 0].tolist(),
            }
        torch.save(out, f"{out_dir}/rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def learner_rank_worker(rank: int, world: int, port: int, model_dir: str, out_dir: str, overrides: list[str]) -> None:
    """One rank of a data-parallel learner (real DeepSpeed, gloo): rank 0 trains the step's first 8
    trajectories (groups 0-1), rank 1 the last 4 (group 2); saves the step's metrics and weights."""
    import os

    os.environ.update(
        RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)
    )
    from learner.step.trainer import Learner
    from stare.config import build_config

    learner = Learner(build_config({}, overrides=overrides), Path(model_dir), pad_id=0)
    trajs = trajectories(0)
    metrics = learner.train_step(trajs[:8] if rank == 0 else trajs[8:])
    weights = torch.cat([p.detach().reshape(-1).double() for p in learner.engine.module.parameters()])
    torch.save({"metrics": metrics, "weights": weights}, f"{out_dir}/rank{rank}.pt")


def leader_follower_worker(
    rank: int, world: int, port: int, model_dir: str, out_dir: str, overrides: list[str], steps: list[int]
) -> None:
    """One rank of a learner driven the way `stare learner` drives several ranks: rank 0 wraps its
    Learner in a LeaderLearner and trains every step's whole batch (the first `steps[i]` groups of
    `trajectories(i)`), gathers the weights for rollout, checkpoints and loads the checkpoint back;
    the other ranks `follow`. Rank 0 saves each step's metrics and the weights it would publish."""
    import os

    os.environ.update(
        RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)
    )
    from learner.process.rank_launch import leave_process_groups
    from learner.process.ranks import LeaderLearner, RankChannel, follow
    from learner.step.trainer import Learner
    from stare.config import build_config

    learner = Learner(build_config({}, overrides=overrides), Path(model_dir), pad_id=0)
    channel = RankChannel(timeout_s=120, heartbeat_s=0.2)  # a heartbeat between every op
    if rank > 0:
        follow(learner, channel)
        leave_process_groups()
        return
    leader = LeaderLearner(learner, channel)
    metrics = []
    for i, groups in enumerate(steps):
        metrics.append(leader.train_step(trajectories(i)[: groups * 4]))
        time.sleep(0.5)  # idle: heartbeats go out
    state = leader.state_dict_for_rollout()
    leader.save(Path(out_dir) / "ckpt", {"note": "x"})
    leader.version = 99  # rank 0's attributes are the learner's
    loaded = leader.load(Path(out_dir) / "ckpt")
    leader.close()
    leave_process_groups()
    torch.save(
        {"metrics": metrics, "state": state, "loaded": loaded["note"], "version": learner.version},
        f"{out_dir}/leader.pt",
    )


def prepare_rank_worker(rank: int, world: int, port: int, model_dir: str, out_dir: str, overrides: list[str]) -> None:
    """One rank of a learner driven as `stare learner` drives several ranks: rank 0 prepares groups 1
    and 2 of `trajectories(0)` (a PREPARE op: one group per rank), then trains all three (a TRAIN op:
    rank 0 gets group 0, rank 1 groups 1 and 2 with the values rank 0 kept); rank 0 saves the step's
    metrics, the trajectory ids it kept and the weights it would publish."""
    import os

    os.environ.update(
        RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)
    )
    from learner.process.rank_launch import leave_process_groups
    from learner.process.ranks import LeaderLearner, RankChannel, follow
    from learner.step.trainer import Learner
    from stare.config import build_config

    learner = Learner(build_config({}, overrides=overrides), Path(model_dir), pad_id=0)
    channel = RankChannel(timeout_s=120, heartbeat_s=0.2)
    if rank > 0:
        follow(learner, channel)
        leave_process_groups()
        return
    leader = LeaderLearner(learner, channel)
    trajs = trajectories(0)
    leader.prepare(trajs[4:])
    kept = sorted(learner.prepared.get(trajs, learner.version))
    metrics = leader.train_step(trajs)
    state = leader.state_dict_for_rollout()
    leader.close()
    leave_process_groups()
    torch.save({"metrics": metrics, "kept": kept, "state": state}, f"{out_dir}/leader.pt")


def silent_leader_worker(rank: int, world: int, port: int, out_dir: str) -> None:
    """Rank 0 forms the rank channel and then says nothing (hung) for longer than its timeout; rank 1
    follows and must give up with an error naming rank 0 instead of waiting forever."""
    import datetime

    import torch.distributed as dist

    from learner.process.rank_launch import exit_abandoning_process_groups
    from learner.process.ranks import RankChannel, follow

    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(seconds=60),
    )
    channel = RankChannel(timeout_s=2.0, heartbeat_s=0.5)
    if rank == 0:
        time.sleep(8)
        return
    t0 = time.monotonic()
    try:
        follow(None, channel)
        outcome = "returned"
    except RuntimeError as err:
        outcome = str(err)
    Path(out_dir, "follower.txt").write_text(f"{time.monotonic() - t0:.1f}\n{outcome}")
    exit_abandoning_process_groups(0)  # as run_follower does (with 1) after a timed-out receive
