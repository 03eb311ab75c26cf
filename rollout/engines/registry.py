"""The rollout engines' registry: one `EngineSpec` per engine, its config (its run-config section,
stare.config.sections.ENGINE_SECTIONS, plus the model) and its builder; `build_engine(config)`
builds the one a config names. Builders import their heavy dependency (transformers, vLLM) lazily.

Add an engine: its module in rollout/engines/ (the `RolloutEngine` protocol of base.py), its
run-config section in stare/config/sections.py (read by every process without the engine's
dependency), its entry below, a test (tests/rollout/test_engine_registry.py checks the two
tables name the same engines)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, field_validator

from rollout.engines.base import RolloutEngine
from stare.config import HfEngineSection, VllmEngineSection

# --- configs ---------------------------------------------------------------------------------


_ENGINE_DTYPE = Literal["float32", "bfloat16", "float16"]


class HFEngineConfig(HfEngineSection):
    """The transformers engine: its run-config section (stare.config.HfEngineSection) plus the model."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    model_path: str = Field(description="Directory of a Hugging Face model (config + safetensors).")
    dtype: _ENGINE_DTYPE = Field("float32", description="Weights and compute dtype; log-probs are always fp32.")
    device: str = Field("cpu", description="torch device, e.g. 'cpu' or 'cuda:0'; auto: cuda when there is one.")

    @field_validator("device")
    @classmethod
    def _resolve_auto(cls, device: str) -> str:
        if device != "auto":
            return device
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"


class VLLMEngineConfig(VllmEngineSection):
    """vLLM in process: its run-config section (stare.config.VllmEngineSection) plus the model."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    model_path: str = Field(description="Directory of a Hugging Face model (config + safetensors).")
    dtype: _ENGINE_DTYPE = Field(
        "float32", description="Model dtype. bf16 log-probs differ from an fp32 recompute by up to ~0.1."
    )
    seed: int = Field(0, ge=0, description="Engine seed (used for requests without their own seed).")
    sleep_mode: bool = Field(
        False,
        description="Build with vLLM's enable_sleep_mode (CUDA only), so the engine can "
        "sleep while a learner in the same process steps (`stare train`, system.colocate).",
    )
    inflight_updates: bool = Field(
        False,
        description="Take new weights between engine steps with requests in flight "
        "(system.inflight_weight_updates; rollout.engines.base, 'In-flight weight updates').",
    )
    external_launcher: bool = Field(
        False,
        description="This process is one rank of a torch.distributed world formed "
        "already (the node-colocated learner): vLLM joins it as one engine per rank, each an "
        "independent replica on the rank's LOCAL_RANK GPU (distributed_executor_backend "
        "external_launcher), instead of forming a one-process group of its own.",
    )


# --- registry --------------------------------------------------------------------------------


def _build_hf(config: HFEngineConfig) -> RolloutEngine:
    from rollout.engines.hf_engine import HFEngine

    return HFEngine(config.model_path, dtype=config.dtype, device=config.device, max_batch_size=config.max_batch_size)


def _build_vllm(config: VLLMEngineConfig) -> RolloutEngine:
    from rollout.engines.vllm_args import engine_args
    from rollout.engines.vllm_engine import VLLMEngine

    return VLLMEngine(
        config.model_path,
        dtype=config.dtype,
        seed=config.seed,
        cpu_kvcache_space_gib=config.cpu_kvcache_space_gib,
        sleep_mode=config.sleep_mode,
        inflight_updates=config.inflight_updates,
        **engine_args(config),
        # a rank of the learner's world: vLLM's ExternalDP layout, one independent engine per rank
        **({"distributed_executor_backend": "external_launcher"} if config.external_launcher else {}),
    )


@dataclass(frozen=True)
class EngineSpec:
    config: type[BaseModel]  # its run-config section + the model (the name is the section's)
    build: Callable[[Any], RolloutEngine]


ENGINES: dict[str, EngineSpec] = {
    spec.config.model_fields["name"].default: spec
    for spec in (EngineSpec(HFEngineConfig, _build_hf), EngineSpec(VLLMEngineConfig, _build_vllm))
}

EngineConfig = Annotated[Union[tuple(spec.config for spec in ENGINES.values())], Field(discriminator="name")]  # noqa: UP007


def build_engine(config: HFEngineConfig | VLLMEngineConfig | Mapping[str, Any]) -> RolloutEngine:
    """Build the engine that `config` names (a config object, or a mapping with a `name` key)."""
    if isinstance(config, Mapping):
        name = config.get("name")
        if name not in ENGINES:
            raise ValueError(f"unknown rollout engine {name!r}; valid names: {sorted(ENGINES)}")
        config = TypeAdapter(EngineConfig).validate_python(dict(config))
    name = getattr(config, "name", None)
    if name not in ENGINES:
        raise ValueError(f"unknown rollout engine {name!r}; valid names: {sorted(ENGINES)}")
    spec = ENGINES[name]
    if not isinstance(config, spec.config):
        raise TypeError(f"engine {name!r} takes a {spec.config.__name__}, got {type(config).__name__}")
    return spec.build(config)
