"""Acceptance overall and per slice, as the eval JSON holds it.

The slices are those of the generation run's acceptance: partition, turn index, with and
without tools, with and without images, output-length bucket. Each slice pools its requests'
counters (``sglang/speculative.py``, ``summarize``): never a mean of per-request ratios.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from eagle3_datagen.sglang.speculative import (
    AcceptanceSummary,
    SpecRequestStats,
    length_bucket,
    summarize,
    summarize_by,
)

# Output-length bucket edges, in tokens of the held-out request's output.
OUTPUT_BUCKETS = (128, 512, 2048, 8192)
SLICES = ("partition", "turn", "tools", "images", "output_length")


@dataclass(frozen=True, slots=True)
class Measured:
    """One held-out request's answer: its counters and what it is sliced by."""

    partition: str
    id: str
    turn: int
    tools: bool
    images: bool
    stats: SpecRequestStats

    def key(self, slice_name: str) -> str:
        if slice_name == "partition":
            return self.partition
        if slice_name == "turn":
            return str(self.turn)
        if slice_name == "tools":
            return "tools" if self.tools else "no tools"
        if slice_name == "images":
            return "images" if self.images else "no images"
        return length_bucket(self.stats.completion_tokens, OUTPUT_BUCKETS)


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 4)


def summary_dict(s: AcceptanceSummary) -> dict[str, Any]:
    """One summary as JSON: accept length (SGLang's server-wide formula), acceptance per draft
    position (reached, and given the previous one), and the pooled counters behind them."""
    return {
        "records": s.requests,
        "accept_length": _round(s.accept_length),
        "tokens_per_verify": _round(s.tokens_per_verify),
        "accept_rate": _round(s.accept_rate),
        "position_acceptance": [round(x, 4) for x in s.position_reached],
        "position_conditional": [_round(x) for x in s.position_conditional],
        "verify_ct": s.verify_ct,
        "num_correct_drafts": s.num_correct_drafts,
        "completion_tokens": s.completion_tokens,
        "correct_drafts_histogram": list(s.correct_drafts_histogram),
    }


def acceptance(
    measured: Sequence[Measured], num_positions: int | None
) -> tuple[dict[str, Any], dict[str, dict[str, dict[str, Any]]]]:
    """The overall summary and, per slice, one summary per value (values sorted)."""
    overall = summary_dict(summarize((m.stats for m in measured), num_positions))
    slices: dict[str, dict[str, dict[str, Any]]] = {}
    for name in SLICES:
        by = summarize_by(((m.key(name), m.stats) for m in measured), num_positions)
        slices[name] = {k: summary_dict(by[k]) for k in sorted(by, key=_order)}
    return overall, slices


def _order(label: str) -> tuple[int, str]:
    """Numbers in numeric order (turns, bucket edges), then the rest by name."""
    digits = "".join(c for c in label.split("-")[0] if c.isdigit())
    if not digits:
        return (1 << 62, label)
    return (int(digits) - (1 if label.startswith("<") else 0), label)
