"""The bounds a record must keep to be read from a run's streams: token ids inside the model's vocabulary,
a group no larger than the run samples, lengths the model and the rollout can have produced. A record
outside them is rejected where it is read (the stream dead-letters it with the reason naming the field and
the bound, and the learner closes its group), never a crash further on: a token id past the vocabulary
was an IndexError in the learner's embedding, a prompt task asking for 100000 samples a rollout worker
allocating without end.

Bounds from the config (and the model's config.json where the role has not loaded the model):
* group size: `rollout.samples_per_prompt` on the training streams; on the evaluation streams the most
  samples an evaluation asks per problem (task.eval_k, final_eval_k, eval_sources' n; 1 for greedy);
* response tokens: `rollout.max_new_tokens` (with the tool loop: max_turns turns plus max_turns - 1
  observations of max_observation_tokens);
* prompt + response tokens: the model's context (`rollout.engine.max_model_len`, else the model's
  max_position_embeddings), when known;
* token ids in [0, vocab_size), when the role knows the vocabulary; loss_mask values 0 or 1.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from stare.transport.records import EvalTask, PromptTask, RecordError, Trajectory


@dataclass(frozen=True)
class RecordLimits:
    max_group_size: int
    max_response_tokens: int
    context: int | None = None  # prompt + response tokens
    vocab_size: int | None = None
    max_eval_new_tokens: int | None = None  # EvalTask.max_new_tokens

    def check(self, record: Any) -> None:
        """Raise RecordError naming the field and the bound `record` breaks."""
        name = type(record).__name__
        # (a group_size below 1 fails where it is used: Trajectory.validate, the rollout's SamplingParams)
        if isinstance(record, (PromptTask, Trajectory)) and record.group_size > self.max_group_size:
            raise RecordError(
                f"{name}.group_size is {record.group_size}, beyond this run's {self.max_group_size} "
                "(rollout.samples_per_prompt)"
            )
        if isinstance(record, EvalTask):
            if record.n > self.max_group_size:
                raise RecordError(
                    f"EvalTask.n is {record.n}, beyond the {self.max_group_size} this run's evaluation asks"
                )
            if self.max_eval_new_tokens is not None and record.max_new_tokens > self.max_eval_new_tokens:
                raise RecordError(
                    f"EvalTask.max_new_tokens is {record.max_new_tokens}, beyond rollout.max_new_tokens "
                    f"({self.max_eval_new_tokens})"
                )
        prompt = np.asarray(record.prompt_token_ids)
        response = np.asarray(getattr(record, "response_token_ids", np.zeros(0, dtype=np.int64)))
        if len(response) > self.max_response_tokens:
            raise RecordError(
                f"{name}.response_token_ids has {len(response)} tokens, beyond the {self.max_response_tokens} this "
                "run samples (rollout.max_new_tokens)"
            )
        # a prompt task's prompt may be longer: the rollout worker truncates it (data.prompt_overflow)
        if self.context is not None and isinstance(record, Trajectory) and len(prompt) + len(response) > self.context:
            raise RecordError(
                f"{name} has {len(prompt)} prompt + {len(response)} response tokens, beyond the model's context of "
                f"{self.context} (rollout.engine.max_model_len, else the model's max_position_embeddings)"
            )
        if self.vocab_size is not None:
            for field, ids in (("prompt_token_ids", prompt), ("response_token_ids", response)):
                if len(ids) and (int(ids.min()) < 0 or int(ids.max()) >= self.vocab_size):
                    bad = int(ids.min()) if int(ids.min()) < 0 else int(ids.max())
                    raise RecordError(
                        f"{name}.{field} has token id {bad}, outside the model's vocabulary [0, {self.vocab_size})"
                    )
        if isinstance(record, Trajectory) and len(record.loss_mask) and int(record.loss_mask.max()) > 1:
            raise RecordError(f"Trajectory.loss_mask has value {int(record.loss_mask.max())}; it must be 0 or 1")


def response_cap(cfg: Any) -> int:
    """The most response tokens a trajectory of this run can have."""
    r = cfg.rollout
    tools = r.tool_use
    if not tools.enabled:
        return int(r.max_new_tokens)
    return int(tools.max_turns * r.max_new_tokens + (tools.max_turns - 1) * tools.max_observation_tokens)


def eval_group_cap(cfg: Any) -> int:
    """The most samples an evaluation of this run asks for one problem."""
    t = cfg.task
    return int(max([1, t.eval_k, t.final_eval_k or 0, *(e.n for e in t.eval_sources.values())]))


def model_bounds(model_path: Any) -> tuple[int | None, int | None]:
    """(vocab_size, max_position_embeddings) from the model folder's config.json; None where unknown
    (no folder: a hub name, a GGUF file)."""
    try:
        raw = json.loads((Path(model_path) / "config.json").read_text())
    except (OSError, TypeError, ValueError):
        return None, None
    text = raw.get("text_config") or raw
    vocab, positions = text.get("vocab_size"), text.get("max_position_embeddings")
    return (int(vocab) if vocab else None), (int(positions) if positions else None)


def run_limits(cfg: Any, vocab_size: int | None = None, model_path: Any = None) -> tuple[RecordLimits, RecordLimits]:
    """The run's (training, evaluation) stream bounds; `vocab_size`: the model the role loaded (else read
    from the config.json of `model_path`, else of model.path, if any)."""
    folder = model_path if model_path is not None else cfg.model.path
    file_vocab, positions = model_bounds(folder) if folder is not None else (None, None)
    vocab = vocab_size if vocab_size is not None else file_vocab
    context = getattr(cfg.rollout.engine, "max_model_len", None) or positions
    response = response_cap(cfg)
    training = RecordLimits(cfg.rollout.samples_per_prompt, response, context, vocab)
    evaluation = RecordLimits(eval_group_cap(cfg), response, context, vocab, int(cfg.rollout.max_new_tokens))
    return training, evaluation
