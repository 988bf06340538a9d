"""One pass over a partition's input: its batches, its repeated ids, and what identifies it.

Why: a rerun must know which committed batches still describe the input as it is now. Each
batch gets a ``key`` from everything its outcome depends on (the file's path, its line numbers,
its bytes, and which of its lines repeat an id first seen elsewhere); a commit marker counts
only while its key is the current one. The whole file's size, SHA-256 and line count go to the
manifest, so a dataset can be checked against its inputs later (``validate --input``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from eagle3_datagen.errors import InputFileError
from eagle3_datagen.inputs.prompts import (
    BatchSpec,
    DuplicateFinder,
    Prompt,
    bytes_digest,
    is_parquet,
    parse_prompt,
    plan_batches,
    read_batch,
    read_range,
    rows_digest,
    split_lines,
)


@dataclass(frozen=True, slots=True)
class InputInfo:
    """What the manifest records about a partition's input file."""

    path: str
    size: int
    sha256: str
    lines: int

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(slots=True)
class InputScan:
    batches: list[BatchSpec]
    duplicates: dict[int, int]  # line -> earlier line with the same id
    info: InputInfo


def file_sha256(path: str | Path) -> str:
    h = hashlib.sha256()
    try:
        with open(path, "rb") as fh:
            while chunk := fh.read(1 << 20):
                h.update(chunk)
    except OSError as err:
        raise InputFileError(f"{path}: cannot read input: {err.strerror or err}") from None
    return h.hexdigest()


def batch_key(spec: BatchSpec, content_digest: str, duplicates: dict[int, int]) -> str:
    """The identity of a batch's input: path, line range, bytes, repeated-id lines."""
    h = hashlib.blake2b(digest_size=16)
    h.update(orjson.dumps([os.path.abspath(spec.path), spec.first_line, spec.count]))
    h.update(content_digest.encode())
    h.update(orjson.dumps(sorted(duplicates.items())))
    return h.hexdigest()


def scan_input(partition: str, path: str | Path, batch_size: int) -> InputScan:
    """Plan ``path`` into batches of ``batch_size`` lines, streaming it once (plus a re-read of
    each batch's range, which the page cache serves): no prompt is held in memory."""
    finder = DuplicateFinder()
    specs: list[BatchSpec] = []
    digests: list[str] = []
    whole = hashlib.sha256()
    parquet = is_parquet(path)
    for spec in plan_batches(partition, path, batch_size):
        if parquet:
            items = read_batch(spec)
            digest = rows_digest(row for _, row in items if isinstance(row, dict))
        else:
            data = read_range(spec)
            whole.update(data)
            digest = bytes_digest(data)
            items = split_lines(spec, data)
        for line, raw in items:
            parsed = parse_prompt(raw, line)
            if isinstance(parsed, Prompt):
                finder.add(parsed.id, line)
        specs.append(spec)
        digests.append(digest)
    duplicates = finder.duplicates()
    by_batch: list[dict[int, int]] = [{} for _ in specs]
    if duplicates:
        starts = [s.first_line for s in specs]
        import bisect

        for line, first in duplicates.items():
            by_batch[bisect.bisect_right(starts, line) - 1][line] = first
    batches = [
        dataclasses.replace(spec, key=batch_key(spec, digest, dups), digest=digest)
        for spec, digest, dups in zip(specs, digests, by_batch, strict=True)
    ]
    info = InputInfo(
        path=str(path),
        size=Path(path).stat().st_size,
        sha256=file_sha256(path) if parquet else whole.hexdigest(),
        lines=sum(s.count for s in specs),
    )
    return InputScan(batches, duplicates, info)
