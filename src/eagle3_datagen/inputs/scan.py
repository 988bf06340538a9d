"""One pass over a partition's input: its batches, its repeated ids, and what identifies it.

Why: a rerun must know which committed batches still describe the input as it is now. Each
batch gets a ``key`` from everything its outcome depends on (the file's path, its line numbers,
its bytes, and which of its lines repeat an id first seen elsewhere); a commit marker counts
only while its key is the current one. The whole file's size, SHA-256 and line count go to the
manifest, so a dataset can be checked against its inputs later (``validate --input``).
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import hashlib
import os
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from eagle3_datagen.config import NearDuplicates
from eagle3_datagen.errors import InputFileError
from eagle3_datagen.inputs.near_dups import NearDuplicateFinder, Similar
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
    # Prompts that repeat an earlier line's (inputs/near_dups.py), and what the policy did.
    exact_duplicates: int = 0
    near_duplicates: int = 0
    near_duplicates_policy: str = "off"

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(slots=True)
class InputScan:
    batches: list[BatchSpec]
    duplicates: dict[int, int]  # line -> earlier line with the same id
    info: InputInfo
    similar: list[Similar] = dataclasses.field(default_factory=list)  # by line
    dropped: dict[int, Similar] = dataclasses.field(default_factory=dict)  # policy drop
    # The first line of each distinct (mode named by the line, the line's own kwargs): what
    # the plan renders once on a probe before any request (generate/kwargs_probe.py).
    kwargs_lines: dict[str, tuple[int, str | None, dict[str, Any]]] = dataclasses.field(
        default_factory=dict
    )


def _by_batch(specs: list[BatchSpec], lines: dict[int, Any]) -> list[dict[int, Any]]:
    """``lines`` split by the batch each line is in."""
    import bisect

    out: list[dict[int, Any]] = [{} for _ in specs]
    starts = [s.first_line for s in specs]
    for line, value in lines.items():
        out[bisect.bisect_right(starts, line) - 1][line] = value
    return out


def file_sha256(path: str | Path) -> str:
    h = hashlib.sha256()
    try:
        with open(path, "rb") as fh:
            while chunk := fh.read(1 << 20):
                h.update(chunk)
    except OSError as err:
        raise InputFileError(f"{path}: cannot read input: {err.strerror or err}") from None
    return h.hexdigest()


def batch_key(
    spec: BatchSpec,
    content_digest: str,
    duplicates: dict[int, int],
    dropped: dict[int, Similar] | None = None,
) -> str:
    """The identity of a batch's input: path, line range, bytes, repeated-id lines, and the
    lines a ``drop`` policy drops as repeated prompts."""
    h = hashlib.blake2b(digest_size=16)
    h.update(orjson.dumps([os.path.abspath(spec.path), spec.first_line, spec.count]))
    h.update(content_digest.encode())
    h.update(orjson.dumps(sorted(duplicates.items())))
    if dropped:  # nothing dropped: the key batches had before the policy existed
        h.update(orjson.dumps(sorted((s.line, s.first, s.kind) for s in dropped.values())))
    return h.hexdigest()


def _undeclared(path: str | Path, line: int, mode: str, modes: Collection[str]) -> str:
    declared = ", ".join(sorted(modes)) or "none"
    return f"{path}:{line}: mode {mode!r} is not declared in model.modes (declared: {declared})"


def kwargs_key(mode: str | None, kwargs: dict[str, Any]) -> str:
    """A line's named mode and own kwargs as one key (``InputScan.kwargs_lines``)."""
    return orjson.dumps([mode, kwargs], option=orjson.OPT_SORT_KEYS).decode()


def scan_input(
    partition: str,
    path: str | Path,
    batch_size: int,
    near: NearDuplicates | None = None,
    modes: Collection[str] | None = None,
) -> InputScan:
    """Plan ``path`` into batches of ``batch_size`` lines, streaming it once (plus a re-read of
    each batch's range, which the page cache serves): no prompt is held in memory. With
    ``near`` (policy other than off), prompts that repeat an earlier line's are found too.
    With ``modes`` (model.modes' names), a line naming any other mode stops the plan, before
    any request of the partition (docs/modes.md)."""
    finder = DuplicateFinder()
    policy = near.policy if near else "off"
    similar_finder = NearDuplicateFinder(near.threshold) if near and policy != "off" else None
    specs: list[BatchSpec] = []
    digests: list[str] = []
    kwargs_lines: dict[str, tuple[int, str | None, dict[str, Any]]] = {}
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
                if modes is not None and parsed.mode is not None and parsed.mode not in modes:
                    raise InputFileError(_undeclared(path, line, parsed.mode, modes))
                if parsed.mode is not None or parsed.kwargs:
                    key = kwargs_key(parsed.mode, parsed.kwargs)
                    kwargs_lines.setdefault(key, (line, parsed.mode, parsed.kwargs))
                finder.add(parsed.id, line)
                if similar_finder is not None:
                    similar_finder.add(line, parsed.messages, parsed.tools)
        specs.append(spec)
        digests.append(digest)
    duplicates = finder.duplicates()
    del finder  # its 16 bytes a line are not needed while the near-duplicate search peaks
    similar = similar_finder.find(skip=duplicates) if similar_finder is not None else []
    dropped = {s.line: s for s in similar} if policy == "drop" else {}
    batches = [
        dataclasses.replace(spec, key=batch_key(spec, digest, dups, drop), digest=digest)
        for spec, digest, dups, drop in zip(
            specs, digests, _by_batch(specs, duplicates), _by_batch(specs, dropped), strict=True
        )
    ]
    info = InputInfo(
        path=str(path),
        size=Path(path).stat().st_size,
        sha256=file_sha256(path) if parquet else whole.hexdigest(),
        lines=sum(s.count for s in specs),
        exact_duplicates=sum(s.kind == "exact" for s in similar),
        near_duplicates=sum(s.kind == "near" for s in similar),
        near_duplicates_policy=policy,
    )
    del similar_finder
    release_freed_memory()
    return InputScan(batches, duplicates, info, similar, dropped, kwargs_lines)


def release_freed_memory() -> None:
    """Hand the scan's freed arrays back to the OS. glibc keeps freed heap pages for the
    process, and the batches that follow the scan allocate mostly elsewhere (Python's arenas),
    so without this a 1,000,000-prompt scan left ~75 MB resident under the whole run (figure
    (c)). Not glibc (musl, macOS): nothing to do."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).malloc_trim(0)
