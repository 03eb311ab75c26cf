"""The task component: the run's task's own verifier (`Task.reward`: the arithmetic tasks' exact match,
the dataset task's math-verify check), so a composed reward can add shaping to it (DAPO's overlong
punishment, a format bonus, a function of the user's own)."""

from __future__ import annotations

from reward.verifiers.registry import Verdict, VerifierContext, need, register_verifier
from stare.data.tasks.base import Problem


@register_verifier("task")
def score_task(c, x, context: VerifierContext) -> Verdict:
    if context.task is None:
        raise ValueError("the task component needs the run's task (compute_reward(..., task=...))")
    problem = Problem(
        prompt=x.prompt,
        answer=need(x.answer, "answer", "task"),
        problem_id=x.problem_id,
        level=max(x.level, 1),
        data_source=x.data_source,
    )
    score = float(context.task.reward(problem, x.response))
    return Verdict(score, score >= 1.0)
