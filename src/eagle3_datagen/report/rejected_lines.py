"""The rejected lines of a dataset, one ``file:line: reason`` each, read back from the
committed batches' ``rejects/*.parquet``.

Why: a run's summary counts its rejects by code (``bad_input=2``); the person who made the
input needs which lines and why, to fix them. The end of a run lists the first few and says
how many more there are; ``eagle3-datagen rejects DIR`` lists them all.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from eagle3_datagen.write.dataset_dir import DatasetDir, iter_rows

_COLUMNS = ["source_file", "source_line", "reason_code", "reason", "turn", "sample"]
SHOWN = 5  # lines listed at the end of a run


@dataclass(frozen=True, slots=True)
class RejectedLine:
    """One reject: of an input line, or of one turn and sample of its conversation."""

    partition: str
    file: str
    line: int
    code: str
    reason: str
    turn: int | None = None
    sample: int | None = None

    def text(self) -> str:
        """``file:line: [turn T sample S: ]code: reason``, each said once: an input reject's
        reason starts with its own ``file:line:``, a validation reject's with its code."""
        where = f"{self.file}:{self.line}: "
        reason = self.reason.removeprefix(where).removeprefix(f"{self.code}: ")
        turn = f"turn {self.turn} sample {self.sample}: " if self.turn is not None else ""
        return f"{where}{turn}{self.code}: {reason}"


def rejected_lines(
    dataset: str | Path, partitions: Sequence[str] | None = None
) -> list[RejectedLine]:
    """Every reject of the dataset's committed batches (of ``partitions``, default all), by
    partition, then file and line."""
    found = DatasetDir(dataset)
    names = [p for p in found.partitions() if not partitions or p in partitions]
    out: list[RejectedLine] = []
    for name in names:
        shards, _ = found.shards(name)
        rows = [r for s in shards if s.rejects_path for r in iter_rows(s.rejects_path, _COLUMNS)]
        rows.sort(
            key=lambda r: (r["source_file"], r["source_line"], r["turn"] or 0, r["sample"] or 0)
        )
        out.extend(
            RejectedLine(
                partition=name,
                file=r["source_file"],
                line=r["source_line"],
                code=r["reason_code"],
                reason=" ".join(str(r["reason"]).split()),
                turn=r["turn"],
                sample=r["sample"],
            )
            for r in rows
        )
    return out


def rejects_summary(
    lines: Sequence[RejectedLine], dataset: str | Path, shown: int = SHOWN
) -> Iterator[str]:
    """The end of a run: the first ``shown`` rejected lines, then how many more and the
    command that lists them all; nothing when there are none."""
    if not lines:
        return
    yield f"rejected lines ({len(lines)}):"
    for one in lines[:shown]:
        yield f"  {one.text()}"
    if len(lines) > shown:
        yield f"  ... and {len(lines) - shown} more: eagle3-datagen rejects {dataset}"
