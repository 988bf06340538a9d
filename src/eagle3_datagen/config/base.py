"""The base of every config model: strict, so a typo is an error, not a silent default."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class StrictModel(BaseModel):
    """Strict base: unknown keys are typos, and typos in a 100k-prompt run are expensive."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)
