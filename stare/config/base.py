"""The config's shared base: the error every bad value raises, and the strict section model."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class ConfigError(ValueError):
    """A bad config value; the message names the field and what to do."""


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)  # every number finite
