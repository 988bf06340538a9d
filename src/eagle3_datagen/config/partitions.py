"""Tiers (requests in flight, output length) and the partitions (prompts files) run under them."""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import Field, field_validator

from eagle3_datagen.config.base import Count, StrictModel

MODE_SHARE_SLACK = 1e-6  # a mixture's shares sum to 1 within this
AUTO_PARTITION_CAP = 1024  # a tier with concurrency "auto" never has more in flight

_SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


class Tier(StrictModel):
    """A concurrency class: how many requests are in flight and how long outputs may grow."""

    name: str = Field(title="Tier name")
    """Tier name referenced by partitions, e.g. SHORT or LONG."""
    concurrency: Annotated[int, Field(ge=1, le=4096)] | Literal["auto"] = Field(title="Concurrency")
    """Requests in flight for a partition, or 'auto': the run steers the number in flight from the
    server's own load (SGLang's /metrics), shared fairly by the partitions on the server
    (server.auto_concurrency)."""
    max_tokens: Count = Field(title="Max new tokens")
    """max_new_tokens for every request of the tier."""

    @property
    def is_auto(self) -> bool:
        return self.concurrency == "auto"

    @property
    def in_flight_cap(self) -> int:
        """The partition's own bound on requests in flight: its concurrency, or for 'auto' a
        ceiling the server-wide controller (sglang/concurrency.py) stays below."""
        return AUTO_PARTITION_CAP if self.concurrency == "auto" else self.concurrency


MAX_TOP_LOGPROBS = 64  # per output token; K=20 already costs about 20x the ids' bytes


class Logprobs(StrictModel):
    """The target's per-token distribution, asked for in the same ``/generate`` call
    (docs/logprobs.md): the sampled token's logprob always, the top-K alternatives when K > 0."""

    top_k: int = Field(title="Top-K logprobs", default=0, ge=0, le=MAX_TOP_LOGPROBS)
    """Alternatives kept per output token (SGLang's top_logprobs_num). 0: only the sampled token's
    logprob (column output_logprobs); K > 0 adds top_logprob_ids, top_logprobs and the entropy
    estimates entropy_mean and entropy_p90."""


class NearDuplicates(StrictModel):
    """What the input scan does with prompts that repeat an earlier line's (docs/coverage.md)."""

    policy: Literal["keep", "drop", "off"] = Field(default="keep", title="Policy")
    """keep: report them (log, near_duplicates.jsonl, manifest, card) and generate them; drop:
    report them and reject them as duplicate_prompt or near_duplicate, naming the line they repeat;
    off: do not look."""
    threshold: float = Field(default=0.9, ge=0.5, le=1.0, title="Similarity threshold")
    """Estimated Jaccard similarity of word 3-grams (system prompt and tools left out) from which a
    prompt counts as a near duplicate. The search finds a pair of similarity 0.9 with probability
    0.99, 0.8 with 0.77, 0.7 with 0.38: below 0.8 it misses many."""


class Partition(StrictModel):
    """One prompts file and the tier it runs under."""

    name: str = Field(title="Partition name")
    """Output sub-directory name; letters, digits, '_', '-', '.'."""
    input: str = Field(title="Input file")
    """Prompts file: JSONL (one prompt per line) or Parquet."""
    tier: str = Field(title="Tier")
    """Name of a tier defined in `tiers`."""
    regenerate: Literal["last", "all_turns"] = Field(title="Turns to regenerate", default="last")
    """'last': the last assistant turn, on the data's history. 'all_turns': every assistant turn in
    order, each on the model's own earlier turns (one record per turn; a conversation stops where
    the model's tool calls differ from the data's)."""
    samples: int = Field(title="Samples per prompt", default=1, ge=1, le=1024)
    """Conversations generated per input line, each its own records (id suffix #s<n>, column
    sample)."""
    temperatures: list[Annotated[float, Field(ge=0.0, allow_inf_nan=False)]] | None = Field(
        title="Temperatures", default=None, min_length=1
    )
    """Cycled over the samples (sample n gets temperatures[n % len]); empty: sampling.temperature
    for every sample."""

    logprobs: Logprobs | None = Field(title="Logprobs", default=None)
    """Off when absent. {top_k: K}: every record keeps the target's logprob of each output token
    and, for K > 0, the top-K alternatives and entropy estimates (docs/logprobs.md). The tokens
    drawn are the same either way."""

    near_duplicates: NearDuplicates = Field(
        title="Near-duplicate prompts", default_factory=NearDuplicates
    )
    """Prompts equal after normalisation, or nearly equal (MinHash), to an earlier line: found when
    the input is scanned, reported with both lines."""

    modes: dict[str, Annotated[float, Field(ge=0.0, le=1.0, allow_inf_nan=False)]] | None = Field(
        title="Mode mixture", default=None
    )
    """Share of lines per mode declared in model.modes, e.g. {thinking: 0.6, instant: 0.4}; the
    shares sum to 1. A line's mode is fixed by its id (a rerun keeps it); a line's own mode or
    chat_template_kwargs comes first (docs/modes.md)."""

    def temperature(self, sample: int, default: float) -> float:
        """The temperature of sample ``sample``."""
        return self.temperatures[sample % len(self.temperatures)] if self.temperatures else default

    @field_validator("name")
    @classmethod
    def _safe_name(cls, v: str) -> str:
        if not _SAFE_NAME.match(v) or ".." in v:
            raise ValueError(
                f"partition name {v!r} is not a safe directory name "
                "(letters, digits, '_', '-', '.'; no slashes, no '..')"
            )
        return v

    @field_validator("modes")
    @classmethod
    def _shares(cls, v: dict[str, float] | None) -> dict[str, float] | None:
        if v is not None:
            total = sum(v.values())
            if not v or abs(total - 1.0) > MODE_SHARE_SLACK:
                raise ValueError(f"mode shares sum to {total:.6g}, not 1")
        return v
