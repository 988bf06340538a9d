"""A partition's directory on disk: Parquet shards, rejects and batch commit markers.

Layout of a run's output directory (``manifest.json`` is :mod:`.manifest`'s)::

    <output>/manifest.json                       run fingerprint + per-partition counts
    <output>/<partition>/part-00003.parquet       accepted records of batch 3
    <output>/<partition>/rejects/part-00003.parquet
    <output>/<partition>/_batches/00003.json      commit marker: batch 3 is complete
    <output>/<partition>/_journal/00004.jsonl     finished requests of uncommitted batch 4
    <output>/<partition>/_input.json              the input file's path, size, SHA-256, lines
    <output>/<partition>/_superseded/             batches of an earlier input, out of the
                                                  dataset until the partition completes

Every file is written to a temporary name and renamed, and a batch's marker is written last, so
a reader (or a rerun) never sees half a batch: a batch without a marker did not happen.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.parquet as pq

from eagle3_datagen.errors import OutputWriteError
from eagle3_datagen.write.records import Record, Reject, records_table, rejects_table


def write_failed(path: Path, err: BaseException) -> OutputWriteError:
    """The error of a write that failed: the file, and the cause (e.g. no space left)."""
    cause = err.strerror if isinstance(err, OSError) and err.strerror else str(err)
    return OutputWriteError(f"{path}: cannot write: {cause}")


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``path`` whole or not at all: a temporary name, fsync, rename. A failure (a full
    disk) removes the temporary file and raises :class:`OutputWriteError`."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except OSError as err:
        _drop(tmp)
        raise write_failed(path, err) from err


def atomic_write_parquet(path: Path, table: pa.Table, metadata: dict[str, str] | None) -> None:
    """Write a Parquet file whole or not at all (as :func:`atomic_write_bytes`); the shard is
    fsynced before the rename, so the commit marker written after it never outlives it."""
    if metadata:
        merged = dict(table.schema.metadata or {})
        merged.update({k.encode(): v.encode() for k, v in metadata.items()})
        table = table.replace_schema_metadata(merged)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        pq.write_table(table, tmp, compression="zstd")
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except OSError as err:  # pyarrow's IO errors are OSErrors too
        _drop(tmp)
        raise write_failed(path, err) from err


def _drop(tmp: Path) -> None:
    """Remove a temporary file after a failed write; on a read-only disk even that fails (the
    file was never created then), and the write's own error is the one to report."""
    with contextlib.suppress(OSError):
        tmp.unlink(missing_ok=True)


@dataclass(slots=True)
class BatchSummary:
    """What one batch produced; persisted as its commit marker."""

    partition: str
    index: int
    first_line: int
    lines: int
    accepted: int = 0
    rejected: int = 0
    truncated: int = 0
    rejects_by_reason: dict[str, int] = field(default_factory=dict)
    prompt_tokens: int = 0
    output_tokens: int = 0
    output_lengths: list[int] = field(default_factory=list)
    thinking_lengths: list[int] = field(default_factory=list)
    requests_sent: int = 0
    wall_s: float = 0.0
    # The batch's input key (BatchSpec.key) when it was committed: the marker counts for a
    # rerun only while the input gives the same key ("" in markers of older versions).
    input_key: str = ""
    # Conversations run (input lines x samples, lines rejected before any request excluded)
    # and those that stopped before their last turn, by reason (generate/conversation.py).
    conversations: int = 0
    stopped: int = 0
    stops_by_reason: dict[str, int] = field(default_factory=dict)
    records_by_turn: dict[str, int] = field(default_factory=dict)  # "0", "1", ...: records

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> BatchSummary:
        return cls(**data)


class PartitionOutput:
    """One partition's directory: writes batches atomically, lists what is committed."""

    def __init__(self, root: str | Path, partition: str) -> None:
        self.root = Path(root)
        self.partition = partition
        self.dir = self.root / partition
        self.rejects_dir = self.dir / "rejects"
        self.markers_dir = self.dir / "_batches"
        self.journal_dir = self.dir / "_journal"
        self.superseded_dir = self.dir / "_superseded"
        self.input_path = self.dir / "_input.json"

    def ensure_dirs(self) -> None:
        for d in (self.dir, self.rejects_dir, self.markers_dir):
            d.mkdir(parents=True, exist_ok=True)

    def shard_path(self, index: int) -> Path:
        return self.dir / f"part-{index:05d}.parquet"

    def rejects_path(self, index: int) -> Path:
        return self.rejects_dir / f"part-{index:05d}.parquet"

    def journal_path(self, index: int) -> Path:
        return self.journal_dir / f"{index:05d}.jsonl"

    def marker_path(self, index: int) -> Path:
        return self.markers_dir / f"{index:05d}.json"

    def committed(self, index: int, key: str = "") -> BatchSummary | None:
        """The batch's summary if it was fully written before from the same input, else None."""
        path = self.marker_path(index)
        try:
            marker = BatchSummary.from_json(orjson.loads(path.read_bytes()))
        except FileNotFoundError:
            return None
        return marker if marker.input_key == key else None

    def write_batch(
        self,
        summary: BatchSummary,
        records: list[Record],
        rejects: list[Reject],
        metadata: dict[str, str] | None = None,
    ) -> None:
        """Write the shard, then the rejects, then the marker that commits them; if the
        rejects or the marker cannot be written (the disk filled up meanwhile), the shard is
        taken back: no shard is visible without its marker."""
        try:
            self.ensure_dirs()
        except OSError as err:
            raise write_failed(self.dir, err) from err
        shard = self.shard_path(summary.index)
        atomic_write_parquet(shard, records_table(records), metadata)
        try:
            if rejects:
                atomic_write_parquet(
                    self.rejects_path(summary.index), rejects_table(rejects), metadata
                )
            else:
                try:
                    self.rejects_path(summary.index).unlink(missing_ok=True)
                except OSError as err:  # a read-only disk
                    raise write_failed(self.rejects_path(summary.index), err) from err
            atomic_write_bytes(
                self.marker_path(summary.index),
                # orjson writes the dataclass itself, field by field as asdict would, without
                # asdict's deep copy of every output length (~2 us per record).
                orjson.dumps(summary, option=orjson.OPT_INDENT_2),
            )
        except OutputWriteError:
            _drop(shard)
            if rejects:
                _drop(self.rejects_path(summary.index))
            raise

    def batch_summaries(self) -> list[BatchSummary]:
        if not self.markers_dir.is_dir():
            return []
        return [
            BatchSummary.from_json(orjson.loads(p.read_bytes()))
            for p in sorted(self.markers_dir.glob("*.json"))
        ]

    def shard_paths(self) -> list[Path]:
        return sorted(self.dir.glob("part-*.parquet"))
