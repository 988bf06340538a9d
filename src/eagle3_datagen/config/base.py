"""The base of every config model: strict, so a typo is an error, not a silent default."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field


class StrictModel(BaseModel):
    """Strict base: unknown keys are typos, and typos in a 100k-prompt run are expensive."""

    # A key's docstring is its description: docs/config.md, the run form in Prefect's UI and an
    # editor's hover all read it. Only a description with a computed value passes description=.
    model_config = ConfigDict(
        extra="forbid", validate_assignment=True, use_attribute_docstrings=True
    )


# Bounds that many keys share, named once so a key's type says what its value is.
Seconds = Annotated[float, Field(ge=0)]
"""A wait or a warm-up in seconds; 0 means none."""
PositiveSeconds = Annotated[float, Field(gt=0)]
"""A deadline or a period in seconds; 0 would never wait or never tick."""
Count = Annotated[int, Field(ge=1)]
"""How many of something, at least one."""
