"""The base of every configuration model (pipelines, recipes, model configs): unknown
keys are refused by name, and a loaded configuration does not change."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
