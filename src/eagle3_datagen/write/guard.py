"""Never mix data made under two fingerprints in one output directory.

A batch committed under other settings (model, tokenizer, chat template, sampling, server)
would count as done on a rerun and end up in the training data. So a run refuses an output
directory whose manifest, or whose shards of a partition it is about to run, carry another
fingerprint; with ``overwrite`` it deletes the data of the partitions *it runs* instead, and
nothing else (a fan-out's partition job must never delete the other jobs' partitions).
"""

from __future__ import annotations

import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from eagle3_datagen.errors import OutputConflictError
from eagle3_datagen.provenance import diff_content
from eagle3_datagen.write.dataset_dir import CONTENT_SHA_KEY
from eagle3_datagen.write.manifest import read_manifest
from eagle3_datagen.write.shards import PartitionOutput


def _shard_fingerprint(output: PartitionOutput) -> str | None:
    """The content hash the partition's first shard was written under (None: no shard)."""
    for path in output.shard_paths():
        try:
            meta = pq.read_schema(path).metadata or {}
        except (OSError, ValueError):
            continue  # a torn file is a batch without a marker: it is redone anyway
        value = meta.get(CONTENT_SHA_KEY)
        return value.decode() if value is not None else ""
    return None


def guard_output(
    output_dir: str | Path,
    fingerprint: dict[str, Any],
    partitions: Iterable[str],
    *,
    overwrite: bool = False,
) -> str | None:
    """Check ``output_dir`` before a run of ``partitions`` writes into it.

    Returns None when nothing stands in the way, or (with ``overwrite``) a line saying what was
    deleted. Raises :class:`OutputConflictError` naming what changed otherwise.
    """
    names = list(partitions)
    digest = fingerprint["content_sha256"]
    changes: list[str] = []
    old = read_manifest(output_dir)
    old_fp = (old or {}).get("fingerprint", {})
    if old is not None and old_fp.get("content_sha256") != digest:
        changes = diff_content(old_fp.get("content", {}), fingerprint["content"])
    stale = [
        name
        for name in names
        if (sha := _shard_fingerprint(PartitionOutput(output_dir, name))) is not None
        and sha != digest
    ]
    if not changes and not stale:
        return None
    if not changes:
        changes = [f"{name}: shards written under other settings" for name in stale]
    if not overwrite:
        raise OutputConflictError(
            f"{output_dir} holds data made with different settings; changed: "
            + "; ".join(changes[:10])
            + ". Use a new output directory or --overwrite."
        )
    doomed = names if old_fp.get("content_sha256", digest) != digest else stale
    for name in doomed:
        shutil.rmtree(Path(output_dir) / name, ignore_errors=True)
    return (
        f"--overwrite: deleted the data of {', '.join(doomed)} made with other settings "
        f"({'; '.join(changes[:3])})"
    )
