"""A picture of a partition's data: length distributions, truncation and reject rates.

Read from what is on disk (the committed shards' length columns and the batch markers), so it
describes the dataset, not one run. The histograms are text (markdown code blocks): they render
the same in a Prefect markdown artifact, a terminal and the dataset card, with no plotting
dependency. Bins are powers of two, because outputs of a reasoning model vary in length by
100x and more.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow.compute as pc
import pyarrow.parquet as pq

from eagle3_datagen.report.acceptance import Acceptance, acceptance_markdown, read_acceptance
from eagle3_datagen.write.manifest import summarize_on_disk
from eagle3_datagen.write.shards import PartitionOutput

BAR_WIDTH = 40
_COLUMNS = ["prompt_tokens", "completion_tokens", "think_end_index", "truncated"]


@dataclass(slots=True)
class Distribution:
    """Token counts of one kind, with the numbers a reader looks for first."""

    name: str
    values: list[int] = field(default_factory=list)

    def stats(self) -> dict[str, float]:
        if not self.values:
            return {"count": 0, "mean": 0, "p50": 0, "p90": 0, "p99": 0, "max": 0}
        ordered = sorted(self.values)

        def pct(q: float) -> float:
            return float(ordered[min(len(ordered) - 1, int(q * len(ordered)))])

        return {
            "count": len(ordered),
            "mean": round(sum(ordered) / len(ordered), 1),
            "p50": pct(0.5),
            "p90": pct(0.9),
            "p99": pct(0.99),
            "max": float(ordered[-1]),
        }

    def histogram(self) -> str:
        """Power-of-two bins as text bars: ``  256-511 | ████████  123``."""
        if not self.values:
            return "(no records)"
        bins: dict[int, int] = {}
        for v in self.values:
            b = max(v, 0).bit_length()  # 0 -> 0, 1 -> 1, 2-3 -> 2, 4-7 -> 3, ...
            bins[b] = bins.get(b, 0) + 1
        lo, hi = min(bins), max(bins)
        top = max(bins.values())
        labels = [_bin_label(b) for b in range(lo, hi + 1)]
        width = max(len(label) for label in labels)
        lines = []
        for b, label in zip(range(lo, hi + 1), labels, strict=True):
            n = bins.get(b, 0)
            bar = "█" * (round(BAR_WIDTH * n / top) if n else 0)
            if n and not bar:
                bar = "▏"
            lines.append(f"{label:>{width}} | {bar:<{BAR_WIDTH}} {n}")
        return "\n".join(lines)


def _bin_label(b: int) -> str:
    if b == 0:
        return "0"
    lo, hi = 1 << (b - 1), (1 << b) - 1
    return str(lo) if lo == hi else f"{lo}-{hi}"


@dataclass(slots=True)
class PartitionPicture:
    """What a partition's committed data looks like."""

    partition: str
    input_lines: int  # lines with a committed outcome
    accepted: int
    rejected: int
    truncated: int
    rejects_by_reason: dict[str, int]
    prompt: Distribution
    output: Distribution
    thinking: Distribution
    # Several turns or samples per line (generate/conversation.py); empty for one each.
    conversations: int = 0
    stopped: int = 0
    stops_by_reason: dict[str, int] = field(default_factory=dict)
    records_by_turn: dict[str, int] = field(default_factory=dict)
    # Image prompts (docs/images.md): records with images, their images, the images' tokens.
    image_records: int = 0
    images: int = 0
    image_tokens: int = 0
    # A speculating server's acceptance over the partition (report/acceptance.py); None when
    # the data has no spec fields.
    acceptance: Acceptance | None = None

    @property
    def truncation_rate(self) -> float:
        return self.truncated / self.accepted if self.accepted else 0.0

    @property
    def reject_rate(self) -> float:
        done = self.accepted + self.rejected
        return self.rejected / done if done else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "partition": self.partition,
            "input_lines": self.input_lines,
            "accepted": self.accepted,
            "rejected": self.rejected,
            "truncated": self.truncated,
            "truncation_rate": round(self.truncation_rate, 4),
            "reject_rate": round(self.reject_rate, 4),
            "rejects_by_reason": self.rejects_by_reason,
            "prompt_length": self.prompt.stats(),
            "output_length": self.output.stats(),
            "thinking_length": self.thinking.stats(),
            "conversations": self.conversations,
            "conversations_stopped": self.stopped,
            "stops_by_reason": self.stops_by_reason,
            "records_by_turn": self.records_by_turn,
            "image_records": self.image_records,
            "images": self.images,
            "image_tokens": self.image_tokens,
            **({"acceptance": self.acceptance.to_dict()} if self.acceptance else {}),
        }


def partition_picture(root: str | Path, partition: str) -> PartitionPicture:
    """Read the partition's committed shards (length columns only) and batch markers."""
    prompt = Distribution("prompt length (tokens)")
    output = Distribution("output length (tokens)")
    thinking = Distribution("thinking length (tokens before `</think>`)")
    truncated = 0
    images = [0, 0, 0]  # records with images, images, image tokens
    paths = PartitionOutput(root, partition).shard_paths()
    for path in paths:
        _count_images(path, images)
        table = pq.read_table(path, columns=_COLUMNS)
        prompt.values.extend(table["prompt_tokens"].to_pylist())
        output.values.extend(table["completion_tokens"].to_pylist())
        think = table["think_end_index"]
        thinking.values.extend(pc.filter(think, pc.greater_equal(think, 0)).to_pylist())
        truncated += int(pc.sum(table["truncated"].cast("int64")).as_py() or 0)
    totals = summarize_on_disk(root, partition)
    return PartitionPicture(
        partition=partition,
        input_lines=int(totals["input_lines"]),
        accepted=len(output.values),
        rejected=int(totals["rejected"]),
        truncated=truncated,
        rejects_by_reason=dict(totals["rejects_by_reason"]),
        prompt=prompt,
        output=output,
        thinking=thinking,
        conversations=int(totals.get("conversations", 0)),
        stopped=int(totals.get("conversations_stopped", 0)),
        stops_by_reason=dict(totals.get("stops_by_reason", {})),
        records_by_turn=dict(totals.get("records_by_turn", {})),
        image_records=images[0],
        images=images[1],
        image_tokens=images[2],
        acceptance=read_acceptance(paths),
    )


def _count_images(path: Path, counts: list[int]) -> None:
    """Adds a shard's image records, images and image tokens (shards of older versions and
    text-only ones may have no such column or only nulls)."""
    if "images" not in pq.read_schema(path).names:
        return
    column = pq.read_table(path, columns=["images"])["images"]
    lengths = pc.list_value_length(column)
    counts[0] += int(pc.sum(pc.greater(pc.fill_null(lengths, 0), 0).cast("int64")).as_py() or 0)
    counts[1] += int(pc.sum(lengths).as_py() or 0)
    tokens = pc.struct_field(pc.list_flatten(column), "tokens")
    counts[2] += int(pc.sum(tokens).as_py() or 0)


def stats_table(picture: PartitionPicture) -> str:
    """Markdown table of the three distributions' summary numbers."""
    rows = [
        "| tokens | records | mean | p50 | p90 | p99 | max |",
        "|---|---|---|---|---|---|---|",
    ]
    for dist in (picture.prompt, picture.output, picture.thinking):
        s = dist.stats()
        rows.append(
            f"| {dist.name} | {s['count']:.0f} | {s['mean']:.0f} | {s['p50']:.0f} | "
            f"{s['p90']:.0f} | {s['p99']:.0f} | {s['max']:.0f} |"
        )
    return "\n".join(rows)


def rates_line(picture: PartitionPicture) -> str:
    reasons = ", ".join(f"{k} {v}" for k, v in sorted(picture.rejects_by_reason.items()))
    return (
        f"**{picture.accepted}** accepted, **{picture.rejected}** rejected "
        f"(reject rate {picture.reject_rate:.1%}{': ' + reasons if reasons else ''}); "
        f"**{picture.truncated}** truncated at max_tokens (truncation rate "
        f"{picture.truncation_rate:.1%} of accepted)"
    )


def conversations_line(picture: PartitionPicture) -> str | None:
    """Turns and samples, when a line gives more than one record (None otherwise)."""
    if (
        len(picture.records_by_turn) <= 1
        and not picture.stopped
        and (picture.conversations <= picture.input_lines)
    ):
        return None
    turns = ", ".join(f"turn {k}: {v}" for k, v in picture.records_by_turn.items())
    stops = ", ".join(f"{k} {v}" for k, v in sorted(picture.stops_by_reason.items()))
    return (
        f"**{picture.conversations}** conversations, **{picture.stopped}** stopped before their "
        f"last turn{' (' + stops + ')' if stops else ''}; records by turn: {turns or '-'}"
    )


def images_line(picture: PartitionPicture) -> str | None:
    """Image prompts, when the partition has any (None otherwise)."""
    if not picture.image_records:
        return None
    return (
        f"**{picture.image_records}** records with images ({picture.images} images, "
        f"{picture.image_tokens} image tokens in the prompts the model saw)"
    )


def picture_markdown(picture: PartitionPicture, heading: str = "#") -> str:
    """The partition's data picture as markdown: rates, a stats table, three histograms."""
    parts = [
        f"{heading} Data: {picture.partition}",
        rates_line(picture),
        stats_table(picture),
    ]
    if (conversations := conversations_line(picture)) is not None:
        parts.insert(2, conversations)
    if (images := images_line(picture)) is not None:
        parts.insert(2, images)
    for dist in (picture.output, picture.thinking, picture.prompt):
        parts.append(f"**{dist.name}**\n\n```text\n{dist.histogram()}\n```")
    if picture.acceptance is not None:
        slices = ("turn", "tools", "mode", "images", "output_length")
        parts.append(acceptance_markdown(picture.acceptance, heading + "#", slices).rstrip())
    return "\n\n".join(parts) + "\n"


def picture_description(picture: PartitionPicture) -> str:
    o = picture.output.stats()
    text = (
        f"{picture.partition}: {picture.accepted} records, output p50 {o['p50']:.0f} / p90 "
        f"{o['p90']:.0f} tokens, truncated {picture.truncation_rate:.1%}, rejected "
        f"{picture.reject_rate:.1%}"
    )
    length = picture.acceptance.overall.accept_length if picture.acceptance else None
    return text if length is None else f"{text}, accept length {length:.2f}"
