"""`stare learner`: the learner process of the distributed system.

    feeder -> prompts stream ...rollout, reward... scored stream -> GroupCollector -> Learner
           -> weights (broadcast group or shared folder) -> rollout workers

The learner drives the pace. It keeps `prompts_per_step x (1 + max_staleness)` groups in flight
(published, not yet trained or filtered), each stamped `min_weight_version` = its version at
publish time, so a trajectory is at most `max_staleness` versions old when it is trained; groups
that arrive later than that are dropped whole (`stale_policy: drop`) or trained with the loss's
truncated importance correction (`importance`). `max_staleness: 0` is strictly on-policy; >= 1
lets rollout sample the next steps while the learner trains.

No data loss, no double training: scored entries a step trained stay pending in Redis until a
checkpoint holds that step (then they are acknowledged); the checkpoint keeps the finished
groups. A learner restarted after a crash loads its newest checkpoint, re-reads its pending
entries and trains again exactly the groups the checkpoint lacks; prompts are not published twice
(the published cursor lives in Redis). Entropy changes, pause, resume and checkpoint requests
come from the control plane through `RunControl`.
"""

from __future__ import annotations

import logging
import random
import time
from typing import Any

import numpy as np
import torch

from stare.config import TrainConfig
from stare.run_outputs import batch_metrics, staleness_status, staleness_summary, trained_lags
from stare.transport.redis_streams import retrying, run_key

log = logging.getLogger(__name__)

LEARNER_CONSUMER = "learner"  # one learner per run: a stable consumer name, so a restart re-reads its entries


def build_publisher(cfg: TrainConfig, client):
    s = cfg.system
    if s.weight_sync == "broadcast":
        from stare.weight_sync.broadcast import BroadcastPublisher

        return BroadcastPublisher("0.0.0.0" if s.broadcast_host not in ("127.0.0.1", "localhost") else s.broadcast_host,
                                  s.broadcast_port, timeout_s=s.broadcast_timeout_s)
    from stare.weight_sync.filesystem import FilesystemPublisher

    return FilesystemPublisher(client, cfg.run.name, s.weight_dir or cfg.run_dir / "weights")


class RedisDecisionLog:
    """The groups the learner filtered or dropped since its last checkpoint, as a Redis set (see
    learner/groups.py: a restarted learner must know them, their entries are acknowledged)."""

    def __init__(self, client, run_id: str):
        self.client, self.key = client, run_key(run_id, "decided")

    def record(self, group_id: str) -> None:
        retrying(lambda: self.client.sadd(self.key, group_id), "SADD decided group")

    def recorded(self) -> set[str]:
        return {g.decode() if isinstance(g, bytes) else g
                for g in retrying(lambda: self.client.smembers(self.key), "SMEMBERS decided groups")}

    def clear(self) -> None:
        retrying(lambda: self.client.delete(self.key), "DEL decided groups")


class DistributedLearner:
    def __init__(self, cfg: TrainConfig, rt, redis_url: str):
        from transformers import AutoTokenizer

        from stare.data import build_feeder, eval_problems
        from stare.embedded import resolve_model
        from stare.learner.groups import GroupCollector
        from stare.learner.trainer import Learner
        from stare.run_outputs import RunOutputs
        from stare.tasks.base import build_task
        from stare.services.process import connect_transport

        self.cfg, self.rt = cfg, rt
        if cfg.run.threads is not None:
            torch.set_num_threads(cfg.run.threads)
        random.seed(cfg.run.seed)
        np.random.seed(cfg.run.seed)
        torch.manual_seed(cfg.run.seed)
        self.model_path = resolve_model(cfg, log.info)
        self.tokenizer = AutoTokenizer.from_pretrained(self.model_path)
        self.task = build_task(cfg.task.name, **cfg.task.build_kwargs(self.tokenizer))
        self.learner = Learner(cfg, self.model_path, pad_id=self.tokenizer.pad_token_id or 0)
        self.transport = connect_transport(cfg, redis_url)
        self.cursor_key = run_key(cfg.run.name, "feeder")
        self.feeder = build_feeder(cfg, self.task, self.tokenizer, log.info)
        s = cfg.system
        self.collector = GroupCollector(self.transport.scored, name=LEARNER_CONSUMER,
                                        dynamic_sampling=cfg.data.dynamic_sampling, max_staleness=s.max_staleness,
                                        keep_stale=s.stale_policy == "importance",
                                        decisions=RedisDecisionLog(self.transport.client, cfg.run.name))
        resume_step = None
        ckpt_dir = cfg.run_dir / "checkpoints"
        if (ckpt_dir / "latest").is_file():
            state = self.learner.load(ckpt_dir)
            self.collector.load_state_dict(state["collector"])
            self.feeder.load_state_dict(state["data"])
            resume_step = self.learner.step
            log.info("resumed from %s at step %d", ckpt_dir, resume_step)
        published = retrying(lambda: self.transport.client.hget(self.cursor_key, "cursor"), "HGET feeder cursor")
        # never publish a group twice: continue after what earlier incarnations published
        self.feeder.cursor = max(int(published or 0), self.feeder.cursor)
        self.outputs = RunOutputs(cfg, resume_step=resume_step)
        self.publisher = build_publisher(cfg, self.transport.client)
        self.publisher.publish(self.learner.version, self.learner.state_dict_for_rollout())
        self.eval_engine = None
        self.eval_problems = eval_problems(cfg, self.task, self.tokenizer, log.info)
        self.stop_ids = tuple(i for i in (self.tokenizer.eos_token_id,) if i is not None)

    # ---------------------------------------------------------------- pieces
    def top_up_prompts(self) -> int:
        """Publish prompts until prompts_per_step x (1 + max_staleness) groups are in flight."""
        cfg = self.cfg
        window = cfg.rollout.prompts_per_step * (1 + cfg.system.max_staleness)
        in_flight = self.feeder.cursor - len(self.collector.finished)
        need = window - in_flight
        if need <= 0:
            return 0
        tasks = self.feeder.next_tasks(need)
        for t in tasks:
            t.min_weight_version = self.learner.version
        self.transport.prompts.publish(tasks)
        cursor = self.feeder.cursor
        retrying(lambda: self.transport.client.hset(self.cursor_key, "cursor", cursor), "HSET feeder cursor")
        return len(tasks)

    def evaluate(self) -> dict[str, Any]:
        from stare.evaluation import eval_settings, evaluate
        from stare.rollout.engine import build_engine

        cfg = self.cfg
        if self.eval_engine is None:
            self.eval_engine = build_engine({"name": "hf", "model_path": str(self.model_path), "dtype": cfg.model.dtype})
        self.eval_engine.update_weights(self.learner.state_dict_for_rollout(), self.learner.version)
        result = evaluate(self.eval_engine, self.tokenizer, self.task, self.eval_problems,
                          stop_token_ids=self.stop_ids, **eval_settings(cfg))
        result["step"] = self.learner.step
        self.outputs.log_eval(result)
        log.info("held-out at step %d: greedy %.3f, pass@%d %.3f", result["step"], result["greedy_accuracy"],
                 cfg.task.eval_k, result["pass_at_k"])
        return result

    def checkpoint(self) -> None:
        ckpt_dir = self.outputs.ckpt_dir
        ckpt_dir.mkdir(parents=True, exist_ok=True)
        tag = self.learner.save(ckpt_dir, {"data": self.feeder.state_dict(),
                                           "collector": self.collector.state_dict()})
        acked = self.collector.ack_trained()  # only now: the checkpoint holds what they trained
        self.outputs.prune_checkpoints()
        log.info("checkpoint %s (acknowledged %d trained trajectories)", ckpt_dir / tag, acked)

    def queue_depths(self) -> dict[str, int]:
        t = self.transport
        return {"prompts": t.prompts.backlog(), "raw": t.raw.backlog(), "scored": t.scored.backlog()}

    # ---------------------------------------------------------------- the loop
    def train(self) -> None:
        cfg, rt, control = self.cfg, self.rt, self.rt.control
        learner = self.learner
        control.start(learner.controller, learner.step, {"weight_version": learner.version})
        if learner.step == 0 and not (self.outputs.dir / "eval.jsonl").exists():
            self.evaluate()
        want = cfg.rollout.prompts_per_step
        t_wait, paused = time.perf_counter(), False
        while learner.step < cfg.run.steps and not rt.stop.is_set():
            rt.tick(step=learner.step, weight_version=learner.version)
            directives = control.before_step(learner.controller)
            if directives.checkpoint:
                self.checkpoint()
            if directives.paused:
                if not paused:
                    control.set_phase("paused")
                    paused = True
                self.publisher.serve_joiners(learner.version, learner.state_dict_for_rollout)
                rt.stop.wait(0.5)
                continue
            if paused:  # resumed: say so now, not only after the next step (which may wait for data)
                control.set_phase("training")
                paused = False
            self.top_up_prompts()
            self.publisher.serve_joiners(learner.version, learner.state_dict_for_rollout)
            self.collector.pull(learner.version, block_s=0.5)
            if len(self.collector.ready) < want:
                continue
            trajectories, ids = self.collector.take(want)
            waited = time.perf_counter() - t_wait
            metrics = learner.train_step(trajectories)
            self.collector.trained(trajectories, ids)
            t_pub = time.perf_counter()
            self.publisher.publish(learner.version, learner.state_dict_for_rollout())
            time_publish = time.perf_counter() - t_pub
            stats = self.collector.stats
            lags = trained_lags(trajectories, learner.version - 1)
            step_time = time.perf_counter() - t_wait
            metrics.update(batch_metrics(trajectories, step_time))
            metrics.update(
                algo=cfg.algo,
                time_unix=time.time(),
                time_wait_data_s=waited,
                time_publish_s=time_publish,
                groups=len(trajectories) // max(cfg.rollout.samples_per_prompt, 1),
                filtered_groups_total=stats.filtered_groups,
                stale_groups_total=stats.stale_groups,
                duplicates_total=stats.duplicates,
                weight_sync_failures=getattr(self.publisher, "failures", 0),
                weight_sync_members=len(getattr(self.publisher, "alive_members", [])),
                **staleness_summary(lags),
            )
            step = learner.step
            if step % cfg.task.eval_every == 0 or step == cfg.run.steps:
                metrics["eval_greedy_accuracy"] = self.evaluate()["greedy_accuracy"]
            t_wait = time.perf_counter()
            status = {"weight_version": learner.version, "queue_depths": self.queue_depths(),
                      "staleness": staleness_status(lags), "tokens_per_s": metrics["tokens_per_s"],
                      "step_time_s": step_time}
            control.after_step(learner.controller, metrics, status)
            self.outputs.log_step(metrics)
            self.outputs.log_trained(learner.step, [t.trajectory_id for t in trajectories])
            log.info("step %d: reward %.3f entropy %.3f gate %d W %.2f M %.2f staleness %s (%.1fs, waited %.1fs)",
                     learner.step, metrics["reward_mean"], metrics["entropy"], metrics["gate"], metrics["w"],
                     metrics["m"], metrics["staleness_hist"], step_time, waited)
            if step % cfg.run.checkpoint_every == 0 or step == cfg.run.steps:
                self.checkpoint()
        if rt.stop.is_set() and self.collector.unacked:
            self.checkpoint()  # SIGTERM: leave nothing trained unsaved
        control.set_phase("finished" if learner.step >= cfg.run.steps else "stopped", step=learner.step)

    def close(self) -> None:
        self.publisher.close()
        self.outputs.close()
        self.transport.close()
        if self.eval_engine is not None:
            self.eval_engine.close()


def run(cfg: TrainConfig, *, redis_url: str, name: str = "learner", stop=None) -> None:
    from stare.learner.export import export_run
    from stare.services.process import RoleRuntime

    with RoleRuntime("learner", name, cfg, redis_url, stop=stop) as rt:
        learner = DistributedLearner(cfg, rt, redis_url)
        try:
            learner.train()
            if learner.learner.step >= cfg.run.steps:
                export_run(cfg.run_dir, learner.model_path, log.info, cfg.model.dtype)
        except BaseException:
            rt.control.set_phase("failed", step=learner.learner.step)
            raise
        finally:
            learner.close()
