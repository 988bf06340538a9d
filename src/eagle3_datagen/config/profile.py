"""The traffic a draft will serve (``serving_profile``), which ``eagle3-datagen coverage`` and the
dataset card hold the data against (docs/coverage.md).

Why declared: a draft trained on a mix unlike its traffic accepts less where the traffic is, and
only the operator knows the traffic. Every dimension is optional; a key the tool does not know
is an error naming it (``extra=forbid``), as are buckets that do not parse or overlap and shares
that do not sum to 1.
"""

from __future__ import annotations

import itertools
import re
from typing import Annotated

from pydantic import Field, ValidationInfo, field_validator, model_validator

from eagle3_datagen.config.base import StrictModel

# Scripts a prompt's language is estimated by (report/coverage.py: its Unicode script).
SCRIPTS = (
    "latin",
    "cyrillic",
    "greek",
    "arabic",
    "hebrew",
    "devanagari",
    "thai",
    "han",
    "kana",
    "hangul",
    "other",
)
_SUM_SLACK = 0.011  # shares written to two decimals may sum to 0.99 or 1.01
_LABEL = re.compile(r"^\s*(?:(<|>=)\s*(\d+)|(\d+)\s*-\s*(\d+)|(\d+)\s*\+?)\s*$")

Share = Annotated[float, Field(ge=0.0, le=1.0, allow_inf_nan=False)]


def parse_bucket(label: str) -> tuple[int, int | None]:
    """``(low, high)``, both inclusive (``None``: no upper end), of a bucket label:
    ``<1024``, ``1024-4095``, ``>=4096``, ``4096+`` or ``3`` (just 3)."""
    m = _LABEL.match(label)
    if m is None:
        raise ValueError(
            f"bucket {label!r} is not '<N', 'N-M', '>=N', 'N+' or 'N' (N, M whole numbers)"
        )
    op, n, lo, hi, one = m.groups()
    if op == "<":
        if int(n) == 0:
            raise ValueError(f"bucket {label!r} is empty")
        return 0, int(n) - 1
    if op == ">=":
        return int(n), None
    if lo is not None:
        if int(hi) < int(lo):
            raise ValueError(f"bucket {label!r} ends before it starts")
        return int(lo), int(hi)
    return (int(one), None) if label.strip().endswith("+") else (int(one), int(one))


def _check_shares(shares: dict[str, float], what: str) -> None:
    total = sum(shares.values())
    if shares and abs(total - 1.0) > _SUM_SLACK:
        raise ValueError(f"{what} shares sum to {total:.3g}, not 1")


def _check_buckets(shares: dict[str, float], what: str) -> dict[str, float]:
    ranges = sorted((parse_bucket(label), label) for label in shares)
    for ((_, hi), a), ((lo, _), b) in itertools.pairwise(ranges):
        if hi is None or hi >= lo:
            raise ValueError(f"{what} buckets {a!r} and {b!r} overlap")
    _check_shares(shares, what)
    return shares


class ServingProfile(StrictModel):
    """The traffic the draft will serve, as shares of requests (each record is one request)."""

    tolerance: Share = Field(default=0.05, title="Tolerance")
    """A dimension is flagged when a share differs from the profile's by more than this (absolute,
    0.05 = 5 points), or when a share the profile declares is absent."""
    modes: dict[str, Share] | None = Field(default=None, title="Mode shares")
    """Share of requests per mode name (records without a mode are 'default')."""
    tools: Share | None = Field(default=None, title="With tools")
    """Share of requests that declare tools."""
    tool_results: Share | None = Field(default=None, title="With tool results")
    """Share of requests with a tool result in their history."""
    images: Share | None = Field(default=None, title="With images")
    """Share of requests with an image."""
    turns: dict[str, Share] | None = Field(default=None, title="User turns")
    """Share of requests by user turns in the conversation so far, by bucket: '1', '2-3', '>=4' (or
    '4+')."""
    input_tokens: dict[str, Share] | None = Field(default=None, title="Input length")
    """Share of requests by prompt tokens, by bucket: '<1024', '1024-4095', '>=4096'."""
    output_tokens: dict[str, Share] | None = Field(default=None, title="Output length")
    """Share of requests by output tokens, by bucket as for input_tokens."""
    languages: dict[str, Share] | None = Field(
        default=None,
        title="Languages (by script)",
        description=f"Share of requests by the script of their prompt text: {', '.join(SCRIPTS)}.",
    )

    @field_validator("modes")
    @classmethod
    def _modes(cls, v: dict[str, float] | None) -> dict[str, float] | None:
        if v is not None:
            _check_shares(v, "mode")
        return v

    @field_validator("turns", "input_tokens", "output_tokens")
    @classmethod
    def _buckets(cls, v: dict[str, float] | None, info: ValidationInfo) -> dict[str, float] | None:
        return None if v is None else _check_buckets(v, str(info.field_name))

    @field_validator("languages")
    @classmethod
    def _languages(cls, v: dict[str, float] | None) -> dict[str, float] | None:
        if v is None:
            return v
        unknown = sorted(set(v) - set(SCRIPTS))
        if unknown:
            raise ValueError(f"unknown script(s) {unknown}; known: {', '.join(SCRIPTS)}")
        _check_shares(v, "language")
        return v

    @model_validator(mode="after")
    def _not_empty(self) -> ServingProfile:
        dims = [name for name in type(self).model_fields if name != "tolerance"]
        if all(getattr(self, d) is None for d in dims):
            raise ValueError(f"a serving profile declares at least one of {', '.join(dims)}")
        return self
