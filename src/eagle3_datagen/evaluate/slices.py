"""Acceptance overall and per slice, as the eval JSON holds it.

The slices are the generation run's (``report/acceptance.py``: partition, turn index, with and
without tools, serving mode, with and without images, output-length bucket), computed by the
same code from rows shaped like records, so an eval's slices read like the dataset card's.
Every figure pools the requests' counters (``sglang/speculative.py``, ``summarize``): never a
mean of per-request ratios. The overall figures add the per-position acceptance given the
previous position and the pooled histogram.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from eagle3_datagen.report.acceptance import rows_acceptance
from eagle3_datagen.sglang.speculative import AcceptanceSummary, SpecRequestStats, summarize


@dataclass(frozen=True, slots=True)
class Measured:
    """One held-out request's answer: its counters and a record-shaped row to slice it by."""

    stats: SpecRequestStats
    row: dict[str, Any]


def measured(
    partition: str,
    turn: int,
    has_tools: bool | None,
    stats: SpecRequestStats,
    mode: str | None = None,
) -> Measured:
    """The answer as a row with the record columns the slicing reads (no images: eval sends
    none)."""
    row = {
        "partition": partition,
        "turn": turn,
        "completion_tokens": stats.completion_tokens,
        "has_tools": has_tools,
        "mode": mode,
        "images": None,
        "spec_verify_ct": stats.verify_ct,
        "spec_num_correct_drafts": stats.num_correct_drafts,
        "spec_num_proposed_drafts": stats.num_proposed_drafts,
        "spec_correct_drafts_histogram": list(stats.correct_drafts_histogram),
        "spec_accept_length": stats.accept_length,
        "spec_accept_rate": stats.accept_rate,
    }
    return Measured(stats, row)


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 4)


def overall_dict(s: AcceptanceSummary) -> dict[str, Any]:
    """The whole split: accept length (SGLang's server-wide formula), acceptance per draft
    position (reached, and given the previous one), and the pooled counters behind them."""
    return {
        "accept_length": _round(s.accept_length),
        "tokens_per_verify": _round(s.tokens_per_verify),
        "accept_rate": _round(s.accept_rate),
        "position_acceptance": [round(x, 4) for x in s.position_reached],
        "position_conditional": [_round(x) for x in s.position_conditional],
        "verify_ct": s.verify_ct,
        "num_correct_drafts": s.num_correct_drafts,
        "num_proposed_drafts": s.num_proposed_drafts,
        "completion_tokens": s.completion_tokens,
        "correct_drafts_histogram": list(s.correct_drafts_histogram),
    }


def acceptance(
    answers: Sequence[Measured], num_positions: int | None
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The overall figures and the slices (slice -> value -> figures)."""
    overall = overall_dict(summarize((m.stats for m in answers), num_positions))
    by_slice = rows_acceptance(m.row for m in answers)
    return overall, (by_slice.to_dict()["slices"] if by_slice is not None else {})
