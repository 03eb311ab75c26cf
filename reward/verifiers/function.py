"""Reward functions of the user's own: load them by path and name, check their signature, call them.

Two signatures, called as their frameworks call them:
- verl (`verl/workers/reward_manager/naive.py`): `compute_score(data_source=..., solution_str=...,
  ground_truth=..., extra_info=..., **kwargs)` once per response; it returns a number (a bool counts as
  0/1) or a dict whose finite `"score"` is the reward (its `"acc"`, when present, says whether the answer
  is right; the other keys stay out of the reward).
- TRL (`GRPOTrainer(reward_funcs=...)`): `f(prompts=..., completions=..., **kwargs) -> list[float]`; called
  once per response with lists of one (a raise or a hang costs one sample), with `completion_ids`,
  `ground_truth`, `data_source`, `extra_info`, `problem_id` and `trainer_state` (`.global_step`: the weight
  version that sampled the response) as keyword arguments; `None` means "does not apply": 0 here, as TRL's
  nansum, not an error.
The component's `kwargs` go to every call (verl's `custom_reward_function.reward_kwargs`).

Loading: `path` is a .py file (imported under a module name of its own, as verl's
`spec_from_file_location`) or an importable module; the function is imported once per process. A mistake
(no file, no function, an import that raises, a signature that cannot take the arguments) raises
`ConfigError` naming the component and the fix; `check_functions(config)` makes the same checks at start-up.

Not covered: what the function does. It is trusted code (the user's own) and runs with the scoring
process's rights, under its time and memory limits (reward.scoring), not in the sandbox: it may open files
or call a judge over the network.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import importlib.util
import inspect
import math
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

from reward.verifiers.registry import Verdict, register_verifier
from stare.config.base import ConfigError
from stare.config.reward import FunctionComponent, RewardConfig

VERL_ARGS = ("data_source", "solution_str", "ground_truth", "extra_info")
TRL_ARGS = ("prompts", "completions")
TRL_KWARGS = ("completion_ids", "ground_truth", "data_source", "extra_info", "problem_id", "trainer_state")


class RewardFunctionError(ValueError):
    """A function's result that is not a reward (the message says what came back)."""


def _where(c: FunctionComponent) -> str:
    return f"reward.components[{c.key}] ({c.path}:{c.function})"


def _is_file(path: str) -> bool:
    return path.endswith(".py") or "/" in path or "\\" in path


def _import(path: str, where: str) -> ModuleType:
    if not _is_file(path):
        try:
            return importlib.import_module(path)
        except Exception as err:
            raise ConfigError(
                f"{where}: importing module {path!r} raised {type(err).__name__}: {err}; give a .py file, or a "
                "module importable where the rewards are scored"
            ) from None
    file = Path(path).expanduser()
    if not file.is_file():
        raise ConfigError(
            f"{where}: no such file {file} (a relative path starts at the working directory, {Path.cwd()}); fix "
            "the component's path, or mount the file where the reward workers run (docs/reward.md)"
        )
    name = f"stare_reward_{file.stem}_{hashlib.sha256(str(file.resolve()).encode()).hexdigest()[:12]}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, file)
    if spec is None or spec.loader is None:
        raise ConfigError(f"{where}: {file} cannot be imported as Python; give a .py file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # pickling and dataclasses of the module find it, as verl registers its module
    try:
        spec.loader.exec_module(module)
    except BaseException as err:
        del sys.modules[name]
        if not isinstance(err, Exception):
            raise
        raise ConfigError(f"{where}: importing {file} raised {type(err).__name__}: {err}") from None
    return module


@functools.lru_cache(maxsize=64)
def _function(path: str, function: str, where: str) -> Callable[..., Any]:
    module = _import(path, where)
    fn = getattr(module, function, None)
    if fn is None:
        names = sorted(n for n, v in vars(module).items() if callable(v) and not n.startswith("_"))
        raise ConfigError(
            f"{where}: {path} has no {function!r} (its functions: {names[:10]}); fix the component's function"
        )
    if not callable(fn):
        raise ConfigError(f"{where}: {function!r} in {path} is a {type(fn).__name__}, not a function")
    return fn


def _check_signature(fn: Callable[..., Any], c: FunctionComponent) -> None:
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):  # a builtin: the call will tell
        return
    if c.signature == "trl" and not any(p.kind is p.VAR_KEYWORD for p in sig.parameters.values()):
        raise ConfigError(
            f"{_where(c)}: a trl reward function takes **kwargs (stare passes {', '.join(TRL_KWARGS)}, as "
            f"GRPOTrainer passes the dataset's columns); add **kwargs to {c.function}{sig}"
        )
    names = VERL_ARGS if c.signature == "verl" else TRL_ARGS + TRL_KWARGS
    try:
        sig.bind(**dict.fromkeys(names), **c.kwargs)
    except TypeError as err:
        hint = (
            "f(data_source, solution_str, ground_truth, extra_info) (signature: trl is f(prompts, completions, "
            "**kwargs))"
            if c.signature == "verl"
            else "f(prompts, completions, **kwargs)"
        )
        raise ConfigError(
            f"{_where(c)}: {c.function}{sig} cannot be called as a {c.signature} reward function ({err}); it "
            f"must take {hint}" + (" and the component's kwargs" if c.kwargs else "")
        ) from None


def load_function(c: FunctionComponent) -> Callable[..., Any]:
    """The component's function, imported once per process, its signature checked (ConfigError if not)."""
    fn = _function(c.path, c.function, _where(c))
    _check_signature(fn, c)
    return fn


def check_functions(config: RewardConfig | None) -> None:
    """Import every function component of `config` in this process: at start-up a mistake is one
    ConfigError line (exit 2), not a reward of 0 for every sample."""
    for c in config.functions if config is not None else ():
        load_function(c)


def preload(config_json: str) -> None:
    """A scoring process's initializer (ScoringPool: a raise here is left for each call to report): import
    the functions before the first response, so their import time is not charged to its time limit."""
    check_functions(RewardConfig.model_validate_json(config_json))


def _finite(value: Any, what: str) -> float:
    if isinstance(value, bool):
        return float(value)
    if not isinstance(value, (int, float)) or not math.isfinite(value):
        raise RewardFunctionError(f"{what} {value!r}, not a finite number")
    return float(value)


def call_function(c: FunctionComponent, x: Any) -> Verdict:
    """The function's score (and verdict) of one response `x` (a RewardInput); raises what the function
    raises, RewardFunctionError for a result that is not a reward."""
    fn = load_function(c)
    extra_info = dict(x.extra_info)
    if c.signature == "verl":
        result = fn(
            data_source=x.data_source, solution_str=x.response, ground_truth=x.answer, extra_info=extra_info, **c.kwargs
        )
        if isinstance(result, dict):
            if "score" not in result:
                raise RewardFunctionError(
                    f"returned a dict without 'score' (keys {sorted(map(str, result))[:8]}); verl's dict results "
                    "carry the reward in 'score'"
                )
            acc = result.get("acc")
            return Verdict(_finite(result["score"], "returned score"), None if acc is None else bool(acc))
        return Verdict(_finite(result, "returned"))
    completion: Any = [{"role": "assistant", "content": x.response}] if c.completions == "messages" else x.response
    out = fn(
        prompts=[x.prompt],
        completions=[completion],
        completion_ids=[list(x.response_token_ids)],
        ground_truth=[x.answer],
        data_source=[x.data_source],
        extra_info=[extra_info],
        problem_id=[x.problem_id],
        trainer_state=SimpleNamespace(global_step=x.step),
        **c.kwargs,
    )
    if not isinstance(out, (list, tuple)) or len(out) != 1:
        size = f" of length {len(out)}" if isinstance(out, (list, tuple)) else ""
        raise RewardFunctionError(
            f"returned {type(out).__name__}{size}; a trl reward function returns one number per completion "
            "(here a list of 1)"
        )
    return Verdict(0.0) if out[0] is None else Verdict(_finite(out[0], "returned"))


@register_verifier("function")
def score_function(c: FunctionComponent, x: Any, context: Any) -> Verdict:
    return call_function(c, x)
