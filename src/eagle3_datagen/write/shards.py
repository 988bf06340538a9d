"""The run directory on disk: Parquet shards, rejects, batch commit markers and the manifest.

Layout (see CONTRACT.md)::

    <output>/manifest.json                       run fingerprint + per-partition counts
    <output>/<partition>/part-00003.parquet       accepted records of batch 3
    <output>/<partition>/rejects/part-00003.parquet
    <output>/<partition>/_batches/00003.json      commit marker: batch 3 is complete
    <output>/<partition>/_journal/00004.jsonl     finished requests of uncommitted batch 4

Every file is written to a temporary name and renamed, and a batch's marker is written last, so
a reader (or a rerun) never sees half a batch: a batch without a marker did not happen.
"""

from __future__ import annotations

import os
import statistics
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.parquet as pq

from eagle3_datagen.records import Record, Reject, records_table, rejects_table

MANIFEST = "manifest.json"


def atomic_write_bytes(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def atomic_write_parquet(path: Path, table: pa.Table, metadata: dict[str, str] | None) -> None:
    if metadata:
        merged = dict(table.schema.metadata or {})
        merged.update({k.encode(): v.encode() for k, v in metadata.items()})
        table = table.replace_schema_metadata(merged)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    pq.write_table(table, tmp, compression="zstd")
    os.replace(tmp, path)


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

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> BatchSummary:
        return cls(**data)


def _percentiles(values: list[int]) -> dict[str, float]:
    if not values:
        return {"p50": 0, "p90": 0, "p99": 0, "mean": 0, "max": 0}
    ordered = sorted(values)

    def pct(q: float) -> float:
        return float(ordered[min(len(ordered) - 1, int(q * len(ordered)))])

    return {
        "p50": pct(0.5),
        "p90": pct(0.9),
        "p99": pct(0.99),
        "mean": round(statistics.fmean(ordered), 1),
        "max": float(ordered[-1]),
    }


def summarize(partition: str, batches: list[BatchSummary]) -> dict[str, Any]:
    """Per-partition totals: counts by reason, truncation rate, length distributions."""
    reasons: Counter[str] = Counter()
    out_lens: list[int] = []
    think_lens: list[int] = []
    for b in batches:
        reasons.update(b.rejects_by_reason)
        out_lens.extend(b.output_lengths)
        think_lens.extend(b.thinking_lengths)
    accepted = sum(b.accepted for b in batches)
    truncated = sum(b.truncated for b in batches)
    return {
        "partition": partition,
        "batches": len(batches),
        "input_lines": sum(b.lines for b in batches),
        "accepted": accepted,
        "rejected": sum(b.rejected for b in batches),
        "rejects_by_reason": dict(sorted(reasons.items())),
        "truncated": truncated,
        "truncation_rate": round(truncated / accepted, 4) if accepted else 0.0,
        "prompt_tokens": sum(b.prompt_tokens for b in batches),
        "output_tokens": sum(b.output_tokens for b in batches),
        "output_length": _percentiles(out_lens),
        "thinking_length": _percentiles(think_lens),
        "requests_sent": sum(b.requests_sent for b in batches),
    }


class PartitionOutput:
    """One partition's directory: writes batches atomically, lists what is committed."""

    def __init__(self, root: str | Path, partition: str) -> None:
        self.root = Path(root)
        self.partition = partition
        self.dir = self.root / partition
        self.rejects_dir = self.dir / "rejects"
        self.markers_dir = self.dir / "_batches"
        self.journal_dir = self.dir / "_journal"

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

    def committed(self, index: int) -> BatchSummary | None:
        """The batch's summary if it was fully written before, else None."""
        path = self.marker_path(index)
        try:
            return BatchSummary.from_json(orjson.loads(path.read_bytes()))
        except FileNotFoundError:
            return None

    def write_batch(
        self,
        summary: BatchSummary,
        records: list[Record],
        rejects: list[Reject],
        metadata: dict[str, str] | None = None,
    ) -> None:
        """Write the shard, then the rejects, then the marker that commits them."""
        self.ensure_dirs()
        atomic_write_parquet(self.shard_path(summary.index), records_table(records), metadata)
        if rejects:
            atomic_write_parquet(self.rejects_path(summary.index), rejects_table(rejects), metadata)
        else:
            self.rejects_path(summary.index).unlink(missing_ok=True)
        atomic_write_bytes(
            self.marker_path(summary.index),
            orjson.dumps(asdict(summary), option=orjson.OPT_INDENT_2),
        )

    def batch_summaries(self) -> list[BatchSummary]:
        if not self.markers_dir.is_dir():
            return []
        return [
            BatchSummary.from_json(orjson.loads(p.read_bytes()))
            for p in sorted(self.markers_dir.glob("*.json"))
        ]

    def shard_paths(self) -> list[Path]:
        return sorted(self.dir.glob("part-*.parquet"))


def write_manifest(root: str | Path, manifest: dict[str, Any]) -> Path:
    path = Path(root) / MANIFEST
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(path, orjson.dumps(manifest, option=orjson.OPT_INDENT_2) + b"\n")
    return path


def update_manifest(
    root: str | Path,
    fingerprint: dict[str, Any],
    partitions: dict[str, dict[str, Any]],
    *,
    running: bool = False,
) -> dict[str, Any]:
    """Write the manifest, keeping other partitions' entries made under the same fingerprint.

    Runs that each handle some partitions of one output directory (a partial rerun, or partition
    jobs fanned out to several machines) then share one manifest instead of overwriting it.
    """
    old = read_manifest(root)
    merged: dict[str, dict[str, Any]] = {}
    if old and old.get("fingerprint", {}).get("content_sha256") == fingerprint["content_sha256"]:
        merged.update(old.get("partitions", {}))
    merged.update(partitions)
    failed = any(p.get("status", "completed") != "completed" for p in merged.values())
    manifest = {
        "fingerprint": fingerprint,
        "status": "running" if running else "failed" if failed else "completed",
        "partitions": dict(sorted(merged.items())),
    }
    write_manifest(root, manifest)
    return manifest


def read_manifest(root: str | Path) -> dict[str, Any] | None:
    path = Path(root) / MANIFEST
    try:
        data = orjson.loads(path.read_bytes())
    except FileNotFoundError:
        return None
    return data if isinstance(data, dict) else None
