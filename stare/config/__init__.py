"""The run configuration: one typed pydantic model, loaded from YAML, overridden from the CLI.

Every field has a description and bounds; unknown keys are errors. The sections live by purpose:
`sections` (what is trained: run, model, task, rollout, optimizer), `data` (the prompts it trains on), `system` (how it runs:
workers, staleness, weight sync, the control plane, logging), `algo` (losses and the entropy
controller), `reward` (verifier composition), `train` (the whole `TrainConfig`, `--algo` presets and
loading), `docs` (the generated docs/config.md). Import the public names from here.
"""

from stare.config.base import ConfigError
from stare.config.data import DataSection
from stare.config.sections import (
    ENGINE_SECTIONS,
    DiagnosticsSection,
    EngineSection,
    EvalSource,
    HfEngineSection,
    ModelSection,
    OptimSection,
    RolloutSection,
    RunSection,
    TaskSection,
    ToolUseSection,
    VllmEngineSection,
)
from stare.config.staleness import Staleness, staleness
from stare.config.system import ControlPlaneSection, LoggingSection, SystemSection, WandbSection
from stare.config.train import ALGO_PRESETS, TrainConfig, build_config, load_config, parse_override

__all__ = [
    "ALGO_PRESETS",
    "ENGINE_SECTIONS",
    "ConfigError",
    "ControlPlaneSection",
    "DataSection",
    "DiagnosticsSection",
    "EngineSection",
    "EvalSource",
    "HfEngineSection",
    "LoggingSection",
    "ModelSection",
    "OptimSection",
    "RolloutSection",
    "RunSection",
    "Staleness",
    "SystemSection",
    "TaskSection",
    "ToolUseSection",
    "TrainConfig",
    "VllmEngineSection",
    "WandbSection",
    "build_config",
    "load_config",
    "parse_override",
    "staleness",
]
