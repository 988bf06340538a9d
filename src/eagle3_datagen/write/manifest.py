"""The run's ``manifest.json``: its fingerprint and each partition's totals.

Runs that each handle some partitions of one output directory (a partial rerun, or partition
jobs fanned out to several machines) share one manifest; the totals are always computed from
the commit markers on disk, so they count what is really there.
"""

from __future__ import annotations

import statistics
from collections import Counter
from pathlib import Path
from typing import Any, Literal

import orjson
from pydantic import BaseModel

from eagle3_datagen.write.shards import BatchSummary, PartitionOutput, atomic_write_bytes

MANIFEST = "manifest.json"
PROFILE = "serving_profile"  # the run's config's, for eagle3-datagen coverage DIR


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
    stops: Counter[str] = Counter()
    turns: Counter[str] = Counter()
    for b in batches:
        turns.update(b.records_by_turn)
        reasons.update(b.rejects_by_reason)
        stops.update(b.stops_by_reason)
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
        "conversations": sum(b.conversations for b in batches),
        "conversations_stopped": sum(b.stopped for b in batches),
        "stops_by_reason": dict(sorted(stops.items())),
        "records_by_turn": dict(sorted(turns.items(), key=lambda kv: int(kv[0]))),
    }


def summarize_on_disk(root: str | Path, partition: str) -> dict[str, Any]:
    """:func:`summarize` over the batches of ``partition`` committed under ``root``, with the
    input they were made from (path, size, SHA-256, lines) when the run recorded it."""
    output = PartitionOutput(root, partition)
    summary = summarize(partition, output.batch_summaries())
    try:
        summary["input"] = orjson.loads(output.input_path.read_bytes())
    except (FileNotFoundError, orjson.JSONDecodeError):
        pass
    return summary


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
    serving_profile: BaseModel | Literal["keep"] | None = "keep",
) -> dict[str, Any]:
    """Write the manifest, keeping other partitions' entries made under the same fingerprint.

    Runs that each handle some partitions of one output directory (a partial rerun, or partition
    jobs fanned out to several machines) then share one manifest instead of overwriting it.
    ``serving_profile``, the run's config's (written when the run starts, kept by later
    writes), is recorded so that ``eagle3-datagen coverage DIR`` compares the data with it
    without the config; it changes no token, so it is not part of the fingerprint.
    """
    old = read_manifest(root)
    merged: dict[str, dict[str, Any]] = {}
    # When the data was first written: kept while later runs add to the same data.
    first = fingerprint.get("run", {}).get("created_at")
    if old and old.get("fingerprint", {}).get("content_sha256") == fingerprint["content_sha256"]:
        merged.update(old.get("partitions", {}))
        first = old.get("first_written") or old["fingerprint"].get("run", {}).get("created_at")
    merged.update(partitions)
    failed = any(p.get("status", "completed") != "completed" for p in merged.values())
    manifest = {
        "first_written": first,
        "fingerprint": fingerprint,
        "status": "running" if running else "failed" if failed else "completed",
        "partitions": dict(sorted(merged.items())),
    }
    profile = (old or {}).get(PROFILE) if serving_profile == "keep" else serving_profile
    if isinstance(profile, BaseModel):
        profile = profile.model_dump(mode="json")
    if profile is not None:
        manifest[PROFILE] = profile
    write_manifest(root, manifest)
    return manifest


def read_manifest(root: str | Path) -> dict[str, Any] | None:
    path = Path(root) / MANIFEST
    try:
        data = orjson.loads(path.read_bytes())
    except FileNotFoundError:
        return None
    return data if isinstance(data, dict) else None


def settle_manifest(root: str | Path, names: list[str], failed: set[str]) -> dict[str, Any] | None:
    """Rewrite the manifest's entries of ``names`` from disk, once concurrent writers are done.

    Partition jobs of a fan-out each update the manifest as they finish; the last word is
    taken from the commit markers. None when no job got as far as writing a manifest.
    """
    manifest = read_manifest(root)
    if manifest is None:
        return None
    entries = {
        name: {
            **summarize_on_disk(root, name),
            "status": "failed" if name in failed else "completed",
        }
        for name in names
    }
    return update_manifest(root, manifest["fingerprint"], entries)
