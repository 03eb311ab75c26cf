"""The whole run config (`TrainConfig`), the `--algo` presets, and loading: YAML, `--set` overrides, errors.

`load_config(path, overrides)` applies `--set a.b=value` overrides (values parsed as YAML) and the
`--algo` preset, and turns any validation error into a `ConfigError` whose message names the
dotted field and the fix.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import yaml
from pydantic import Field, PrivateAttr, ValidationError, model_validator

from stare.config.algo import (
    LOSS_CONFIGS,
    ControllerConfig,
    GrpoLossConfig,
    LossConfig,
    StareLossConfig,
    SurrogateConfig,
)
from stare.config.base import ConfigError, _Section
from stare.config.data import DataSection
from stare.config.reward import RewardConfig
from stare.config.sections import (
    DiagnosticsSection,
    ModelSection,
    OptimSection,
    RolloutSection,
    RunSection,
    TaskSection,
)
from stare.config.system import ControlPlaneSection, LoggingSection, SystemSection


def keys_from_rollout(loss: SurrogateConfig) -> bool:
    """STARE's surprisal keyed on the rollout's log-probs (`loss.selection_keys: rollout`): no pre-pass."""
    return getattr(loss, "selection_keys", "learner") == "rollout"


class TrainConfig(_Section):
    """The config of one embedded training run (and of every role in the distributed system)."""

    # the folder of a resumed run, wherever it lives now (`--resume DIR`); run.output_dir/run.name are history then
    _run_dir: Path | None = PrivateAttr(None)
    algo: str = Field("stare", description="The preset this config was built from (informational; set with --algo).")
    run: RunSection = RunSection()
    model: ModelSection = ModelSection()
    task: TaskSection = TaskSection()
    rollout: RolloutSection = RolloutSection()
    data: DataSection = DataSection()
    optim: OptimSection = OptimSection()
    loss: LossConfig = Field(default_factory=StareLossConfig)
    controller: ControllerConfig = ControllerConfig()
    reward: RewardConfig | None = Field(
        None,
        description="The reward as a weighted composition of verifiers (components: math, format, overlong, "
        "code, task (the task's own verifier), function (a reward function of your own: verl's compute_score or "
        "TRL's reward_funcs signature); see docs/reward.md), applied by every reward worker; `scoring`: the time "
        "and memory limits of the processes that score. None: the task's own verifier (task.reward).",
    )
    diagnostics: DiagnosticsSection = DiagnosticsSection()
    system: SystemSection = SystemSection()
    control_plane: ControlPlaneSection = ControlPlaneSection()
    logging: LoggingSection = LoggingSection()

    @model_validator(mode="before")
    @classmethod
    def _legacy_control_key(cls, data: Any) -> Any:
        """`control:` was the control plane's section before it was renamed (it read too much like the
        entropy `controller:`): still accepted, with a warning."""
        if not isinstance(data, dict) or "control" not in data:
            return data
        if "control_plane" in data:
            raise ValueError("both control (the old name) and control_plane are set: keep control_plane only")
        warnings.warn(
            "the config section `control` is now `control_plane` (the control plane's API settings); "
            "read as control_plane, rename it",
            FutureWarning,
            stacklevel=2,
        )
        return {("control_plane" if k == "control" else k): v for k, v in data.items()}

    @model_validator(mode="after")
    def _importance_needs_tis(self) -> TrainConfig:
        if self.system.stale_policy == "importance" and not self.loss.rollout_correction.enabled:
            raise ValueError(
                "system.stale_policy=importance needs loss.rollout_correction (e.g. is_level: token, "
                "is_cap: 2.0): the truncated importance "
                "weight is what corrects a stale trajectory"
            )
        return self

    @model_validator(mode="after")
    def _inflight_needs_staleness_and_streaming(self) -> TrainConfig:
        s = self.system
        if not s.inflight_weight_updates:
            return self
        if s.max_staleness < 1:
            raise ValueError(
                "system.inflight_weight_updates needs system.max_staleness >= 1: a sequence that takes a new "
                "version mid-way has tokens one version old (on-policy every token must come from the "
                "version the learner trains); set max_staleness: 1, or inflight_weight_updates: false"
            )
        if s.rollout_streaming is False or self.rollout.tool_use.enabled:
            raise ValueError(
                "system.inflight_weight_updates needs the streaming rollout loop (weights change between "
                "its engine steps): set system.rollout_streaming to true or null and rollout.tool_use."
                "enabled to false, or inflight_weight_updates: false"
            )
        return self

    @model_validator(mode="after")
    def _lora_without_zero3(self) -> TrainConfig:
        if self.model.lora is not None and self.optim.zero_stage == 3:
            raise ValueError(
                "model.lora with optim.zero_stage=3 is not supported (the adapters are merged from whole "
                "weights): use zero_stage 0-2; the frozen base is not sharded, only adapter states are"
            )
        return self

    @model_validator(mode="after")
    def _colocate_offload_needs_colocation(self) -> TrainConfig:
        s = self.system
        if s.colocate_offload == "optimizer" and s.colocate == "off":
            raise ValueError(
                "system.colocate_offload: optimizer moves the learner's state aside while a colocated "
                "engine samples, but system.colocate is off: set system.colocate to auto or on, or "
                "colocate_offload to none"
            )
        if s.colocate_offload == "optimizer" and self.optim.zero_stage == 3:
            raise ValueError(
                "system.colocate_offload: optimizer needs optim.zero_stage 0-2 (DeepSpeed moves ZeRO-3's "
                "optimizer state to the host only for its own FusedAdam; on one GPU ZeRO-3 shards "
                "nothing): set optim.zero_stage=1, or colocate_offload to none"
            )
        return self

    @model_validator(mode="after")
    def _selection_keys_from_rollout(self) -> TrainConfig:
        if not keys_from_rollout(self.loss):
            return self
        needs = {
            "optim.mini_batches": (self.optim.mini_batches, 1, "the old log-probs come from the update's own forward"),
            "optim.epochs": (self.optim.epochs, 1, "the old log-probs come from the update's own forward"),
            "controller.entropy_source": (
                self.controller.entropy_source,
                "lagged",
                "no pre-pass measures this step's entropy before the backward",
            ),
            "loss.ref_kl": (self.loss.ref_kl, None, "the reference's log-probs are read in the pre-pass"),
            "loss.rollout_correction.mask_level": (
                self.loss.rollout_correction.mask_level,
                None,
                "a mask changes the step's token count before the first backward",
            ),
            "rollout.temperature": (
                self.rollout.temperature,
                1.0,
                "the engine records the log-probs of the distribution it samples, the learner's are at temperature 1",
            ),
            "rollout.top_p": (
                self.rollout.top_p,
                1.0,
                "the engine's log-probs are of the top-p renormalised distribution",
            ),
            "diagnostics.predicted_entropy_change": (
                self.diagnostics.predicted_entropy_change,
                False,
                "dH is computed in the pre-pass",
            ),
        }

        def text(v: object) -> str:
            return "null" if v is None else str(v).lower() if isinstance(v, bool) else str(v)

        wrong = [f"{f}={text(want)} ({why}; got {text(got)})" for f, (got, want, why) in needs.items() if got != want]
        if wrong:
            raise ValueError(
                f"loss.selection_keys=rollout runs no pre-pass: set {', '.join(wrong)}; or loss.selection_keys=learner"
            )
        return self

    @model_validator(mode="after")
    def _mini_batches_hold_groups(self) -> TrainConfig:
        if self.optim.mini_batches > self.rollout.prompts_per_step:
            raise ValueError(
                f"optim.mini_batches ({self.optim.mini_batches}) is more than rollout.prompts_per_step "
                f"({self.rollout.prompts_per_step}): a mini-batch holds whole groups; lower it"
            )
        return self

    @model_validator(mode="after")
    def _reward_fits_the_rollout(self) -> TrainConfig:
        for c in self.reward.components if self.reward is not None else ():
            if c.kind == "code":
                raise ValueError(
                    "reward.components: kind code needs tests that trajectories do not carry yet; "
                    "score code tasks with the task's own verifier (leave reward unset)"
                )
            if c.kind == "overlong" and c.config.max_length - c.config.cache_length >= self.rollout.max_new_tokens:
                raise ValueError(
                    f"reward.components: the overlong penalty starts at max_length - cache_length = "
                    f"{c.config.max_length - c.config.cache_length} tokens, which rollout.max_new_tokens "
                    f"({self.rollout.max_new_tokens}) never reaches: set max_length to the response limit"
                )
        return self

    @model_validator(mode="after")
    def _steps_or_epochs(self) -> TrainConfig:
        if self.run.steps is None and self.data.epochs is None:
            raise ValueError(
                "run.steps is null but data.epochs is not set: set run.steps (the steps to train), or data.epochs "
                "(passes over the training prompts; the steps are derived from it)"
            )
        return self

    @model_validator(mode="after")
    def _dataset_needs_a_model(self) -> TrainConfig:
        if self.task.name in ("dataset", "chat-arithmetic") and self.model.path is None and self.model.source == "tiny":
            raise ValueError(
                f"task.name={self.task.name} needs model.path (or model.source=smollm2): the bundled "
                "tiny model is built for the bundled arithmetic tasks"
            )
        return self

    @property
    def run_dir(self) -> Path:
        return self._run_dir if self._run_dir is not None else self.run.output_dir / self.run.name


# --algo presets: what each algorithm changes relative to the loaded config, from the loss configs
# (stare.config.algo: each loss class lists its presets).
ALGO_PRESETS: dict[str, dict[str, Any]] = {
    algo: {**preset, "loss": {"name": name, **preset.get("loss", {})}}
    for name, cls in LOSS_CONFIGS.items()
    for algo, preset in cls.presets.items()
}

_SURROGATE_KEYS = set(GrpoLossConfig.model_fields) - {"name"} | {"tis_cap"}  # tis_cap: the legacy key


def deep_merge(base: dict[str, Any], update: dict[str, Any]) -> dict[str, Any]:
    """`base` with `update` merged in, section by section (update's values win)."""
    out = dict(base)
    for key, value in update.items():
        out[key] = deep_merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def _apply_preset(raw: dict[str, Any], algo: str) -> dict[str, Any]:
    if algo not in ALGO_PRESETS:
        import difflib

        close = difflib.get_close_matches(algo, list(ALGO_PRESETS), n=1)
        raise ConfigError(
            f"--algo {algo!r} is not a known algorithm"
            + (f" (did you mean {close[0]}?)" if close else "")
            + f"; choose one of {sorted(ALGO_PRESETS)}"
        )
    preset = ALGO_PRESETS[algo]
    loss = raw.get("loss", {}) or {}
    # Keep the shared surrogate settings (clip range, aggregation, TIS) when switching the loss.
    kept = {k: v for k, v in loss.items() if k in _SURROGATE_KEYS}
    if preset["loss"]["name"] != loss.get("name", "stare"):
        loss = kept
    raw = deep_merge(raw, {k: v for k, v in preset.items() if k not in ("loss", "overlong")})
    raw["loss"] = deep_merge(loss, preset["loss"])
    raw["algo"] = algo
    if "run" in raw and "name" in raw["run"] and algo != "stare" and not raw["run"]["name"].endswith(f"-{algo}"):
        raw["run"] = {**raw["run"], "name": f"{raw['run']['name']}-{algo}"}
    return raw


def _with_overlong(raw: dict[str, Any], fraction: float) -> dict[str, Any]:
    """`raw` with DAPO's soft overlong punishment in its reward (after the overrides: it reads the final
    rollout.max_new_tokens): L_max = max_new_tokens, L_cache = `fraction` of it; added to the config's
    reward, or to the task's own verifier when the config has none; a reward that has one keeps its own."""
    max_new = (raw.get("rollout") or {}).get("max_new_tokens", RolloutSection.model_fields["max_new_tokens"].default)
    given = raw.get("reward")
    reward: dict[str, Any] = given if isinstance(given, dict) else {}
    components = list(reward.get("components") or [{"kind": "task"}])
    if not isinstance(max_new, int) or any(isinstance(c, dict) and c.get("kind") == "overlong" for c in components):
        return raw  # a bad length is validation's to name
    cache = max(1, round(fraction * max_new))
    components.append({"kind": "overlong", "config": {"max_length": max_new, "cache_length": cache}})
    return {**raw, "reward": {**reward, "components": components}}


def _set_dotted(raw: dict[str, Any], dotted: str, value: Any) -> None:
    keys = dotted.split(".")
    node = raw
    for key in keys[:-1]:
        if isinstance(node.get(key), str):  # a section given by its name (rollout.engine: vllm)
            node[key] = {"name": node[key]}
        node = node.setdefault(key, {})
        if not isinstance(node, dict):
            raise ConfigError(f"--set {dotted}: {key!r} is not a section")
    node[keys[-1]] = value


def parse_override(text: str) -> tuple[str, Any]:
    """'a.b=value' -> ('a.b', the value parsed as YAML, with YAML 1.2 floats: `2e-1` is 0.2)."""
    from stare.config.files import load_yaml

    if "=" not in text:
        raise ConfigError(f"--set expects KEY=VALUE (e.g. optim.lr=1e-5), got {text!r}")
    key, value = text.split("=", 1)
    try:
        return key.strip(), load_yaml(value)
    except yaml.YAMLError as err:
        raise ConfigError(f"--set {text}: the value is not valid YAML ({str(err).splitlines()[0]}); quote it") from None


def short_set(text: str, limit: int = 80) -> str:
    """A --set as an error line echoes it: cut at `limit` characters."""
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _origin(loc: str, overrides: list[str] | tuple[str, ...], source: Path | None) -> str:
    """Where the value at `loc` came from: the --set that wrote it (or its section), else the file."""
    for text in reversed(overrides):  # the last --set of a key wins
        key = text.split("=", 1)[0].strip()
        if loc and (loc == key or loc.startswith(key + ".") or key.startswith(loc + ".")):
            return f"from --set {short_set(text)}"
    return f"in {source}" if source is not None else ""


def _describe(err: ValidationError, source: Path | None, overrides: list[str] | tuple[str, ...]) -> str:
    from stare.config.suggest import explain  # did-you-mean, verl's names, values shown short

    lines, origins = [], []
    for e in err.errors():
        loc = ".".join(str(p) for p in e["loc"] if not str(p).startswith(("function-after", "tagged-union")))
        loc = loc.replace(".stare.", ".").replace(".grpo.", ".")
        origins.append(origin := _origin(loc, overrides, source))
        lines.append(explain(TrainConfig, e, origin))
    if all(o.startswith("from --set") for o in origins):
        fix = "fix the --set value"
    elif source is not None:
        fix = f"fix the value in {source} or with --set FIELD=VALUE"
    else:
        fix = "fix the value with --set FIELD=VALUE"
    if len(lines) == 1:
        return f"invalid config: {lines[0]}; {fix}"
    return "invalid config:\n  " + "\n  ".join(lines) + "\n" + fix


def build_config(
    raw: dict[str, Any],
    *,
    algo: str | None = None,
    overrides: list[str] | tuple[str, ...] = (),
    source: Path | None = None,
) -> TrainConfig:
    """The config of `raw` (from `source`, a YAML file, when given: errors name it) with the `--algo` preset
    and `--set` overrides applied; a bad value is a ConfigError naming the field and where it came from."""
    raw = dict(raw or {})
    if algo is not None:
        raw = _apply_preset(raw, algo)
    for text in overrides:
        _set_dotted(raw, *parse_override(text))
    if algo is not None and ALGO_PRESETS[algo].get("overlong"):
        raw = _with_overlong(raw, ALGO_PRESETS[algo]["overlong"])
    if isinstance(raw.get("loss"), dict) and "name" not in raw["loss"]:
        raw["loss"] = {"name": "stare", **raw["loss"]}  # the default loss, as if it had been written
    try:
        return TrainConfig.model_validate(raw)
    except ValidationError as err:
        raise ConfigError(_describe(err, source, overrides)) from None


def load_config(
    path: Path | None, *, algo: str | None = None, overrides: list[str] | tuple[str, ...] = ()
) -> TrainConfig:
    """The config of YAML file `path` (None: the built-in defaults) with the preset and overrides."""
    raw: dict[str, Any] = {}
    if path is not None:
        path = Path(path)
        if path.is_dir():
            resume = (
                f"; to continue the run in it: stare train --resume {path}" if (path / "config.yaml").is_file() else ""
            )
            raise ConfigError(f"--config {path} is a folder, not a YAML file: pass the file{resume}")
        if not path.is_file():
            raise ConfigError(f"config file {path} does not exist; pass an existing YAML file to --config")
        from stare.config.files import read_yaml_mapping  # errors name the file, line and column

        raw = read_yaml_mapping(
            path, empty="write the fields to change, or drop --config for the bundled configs/tiny-cpu.yaml"
        )
    return build_config(raw, algo=algo, overrides=overrides, source=path)
