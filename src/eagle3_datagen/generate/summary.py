"""A batch's last steps: its conversations' outcomes counted into the batch's summary, and the
batch written (Parquet files, commit marker) with its journal removed."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from eagle3_datagen.errors import BatchFailed
from eagle3_datagen.inputs.prompts import BatchSpec
from eagle3_datagen.write.journal import BatchJournal
from eagle3_datagen.write.records import Record, Reject
from eagle3_datagen.write.shards import BatchSummary, PartitionOutput


@dataclass(slots=True)
class Outcome:
    """What one conversation left: its records, the reject that ended it, requests sent, and
    why it stopped before its last turn (None: it did not)."""

    records: list[Record] = field(default_factory=list)
    rejects: list[Reject] = field(default_factory=list)
    sent: int = 0
    stop: str | None = None

    def end(self, reject: Reject) -> None:
        self.rejects.append(reject)


def summarize_batch(
    spec: BatchSpec, outcomes: list[Outcome], rejects: list[Reject]
) -> tuple[BatchSummary, list[Record]]:
    """The batch's summary and records from its conversations' outcomes (``rejects`` gets
    theirs); a batch in which an input line has neither a record nor a reject is refused."""
    summary = BatchSummary(spec.partition, spec.index, spec.first_line, spec.count)
    records: list[Record] = []
    for outcome in outcomes:
        records.extend(outcome.records)
        rejects.extend(outcome.rejects)
        summary.requests_sent += outcome.sent
        if outcome.stop is not None:
            summary.stopped += 1
            summary.stops_by_reason[outcome.stop] = summary.stops_by_reason.get(outcome.stop, 0) + 1
    summary.conversations = len(outcomes)
    add_record_counts(summary, records)
    summary.records_by_turn = dict(Counter(str(record.turn) for record in records))
    summary.accepted = len(records)
    summary.rejected = len(rejects)
    summary.rejects_by_reason = dict(Counter(r.reason_code for r in rejects))
    covered = {r.source_line for r in records} | {r.source_line for r in rejects}
    lost = [
        line for line in range(spec.first_line, spec.first_line + spec.count) if line not in covered
    ]
    if lost or len(covered) != spec.count:
        raise BatchFailed(
            f"{spec.label}: {spec.count} input lines but {len(lost)} without a record or a "
            f"reject (first: line {lost[0] if lost else '?'}); refusing to commit a batch "
            "that lost lines"
        )
    summary.input_key = spec.key
    return summary, records


def add_record_counts(summary: BatchSummary, records: list[Record]) -> None:
    """Add the records' truncations, token counts and lengths to their batch's summary."""
    for record in records:
        summary.truncated += record.truncated
        summary.prompt_tokens += len(record.prompt_ids)
        summary.output_tokens += len(record.output_ids)
        summary.output_lengths.append(len(record.output_ids))
        if record.think_end_index >= 0:
            summary.thinking_lengths.append(record.think_end_index)


def commit_batch(
    output: PartitionOutput,
    summary: BatchSummary,
    records: list[Record],
    rejects: list[Reject],
    metadata: dict[str, str],
    journal: BatchJournal,
) -> None:
    """On a worker thread: the batch's Parquet files and commit marker (with their fsync);
    then its journal goes, the marker now standing for these results."""
    records.sort(key=lambda r: r.source_line)
    rejects.sort(key=lambda r: r.source_line)
    output.write_batch(summary, records, rejects, metadata)
    journal.remove()
