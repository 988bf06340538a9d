"""Resume keyed by what the data is, not where it sat in the input.

A rerun into the same output directory after the input changed (lines added anywhere, edited,
removed, reordered, or another file under the same name) must send exactly the prompts that are
not done, and leave each input id once, with the record of its current prompt. A result is done
when one with the same id and the same prompt ids (:func:`~.journal.prompt_key`) was committed:
the tokenizer, chat template and sampling are the same for the whole directory (a rerun under
other settings is refused by :mod:`.guard`), so these two decide what the server returns.

Before any batch runs, :func:`prepare_partition` compares every commit marker with the batch of
the current input at its index (``BatchSpec.key``). A batch whose key changed, or that is gone,
is *superseded*: its shard and rejects are moved to ``<partition>/_superseded/``, then its marker
is deleted. From then on nothing reads them as data: ``part-*.parquet`` globs (e.g.
``datasets.load_dataset``), ``eagle3-datagen validate`` and ``export`` see only live batches.
Their results, and those of the journals of unfinished batches, are indexed by prompt key in a
:class:`ReusePool`; a batch that finds a prompt there copies the record (or the reject) instead
of sending it again. Once every batch of the partition is committed, :func:`drop_superseded`
deletes ``_superseded/`` and the leftover journals.
"""

from __future__ import annotations

import shutil
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import pyarrow.parquet as pq

from eagle3_datagen.inputs.prompts import BatchSpec
from eagle3_datagen.inputs.scan import InputInfo
from eagle3_datagen.sglang.client import GenerateResult
from eagle3_datagen.write.journal import BatchJournal, prompt_key
from eagle3_datagen.write.manifest import summarize_on_disk
from eagle3_datagen.write.records import RECORD_SCHEMA, REJECT_SCHEMA, Record, Reject
from eagle3_datagen.write.shards import (
    BatchSummary,
    PartitionOutput,
    atomic_write_bytes,
)

# Rejects that cost a request; the others (bad input, template, too long, repeated id) are
# decided again on the client at no cost.
_REQUEST_STAGES = ("server", "validation")

Prior = Record | Reject | GenerateResult


@dataclass(slots=True)
class ReusePool:
    """Earlier results that are no longer part of the dataset, by prompt key.

    Superseded shards are read only when a batch asks for one of their rows (one file read per
    file a batch needs), so the index holds two integers per record, never the outputs.
    """

    files: list[Path] = field(default_factory=list)
    index: dict[int, tuple[int, int]] = field(default_factory=dict)  # key -> (file, row)
    journaled: dict[int, GenerateResult] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.index) + len(self.journaled)

    def take(self, keys: list[int]) -> dict[int, Prior]:
        """The earlier result of each key that has one."""
        found: dict[int, Prior] = {}
        wanted: dict[int, list[tuple[int, int]]] = defaultdict(list)
        for key in keys:
            if key in self.journaled:
                found[key] = self.journaled[key]
            elif key in self.index:
                file_no, row = self.index[key]
                wanted[file_no].append((row, key))
        for file_no, rows in wanted.items():
            path = self.files[file_no]
            table = pq.read_table(path).take([row for row, _ in rows])
            records = path.name.startswith("part-")
            for (_, key), data in zip(rows, table.to_pylist(), strict=True):
                if records:
                    found[key] = Record(**{n: data.get(n) for n in RECORD_SCHEMA.names})
                else:
                    found[key] = Reject(**{n: data[n] for n in REJECT_SCHEMA.names})
        return found


def supersede_stale(output: PartitionOutput, batches: list[BatchSpec]) -> list[int]:
    """Move every batch that no longer matches the input out of the dataset; their indexes.

    Shards and rejects without a live marker (a run killed between a shard and its marker, or
    a crash in the middle of this function) go too. Data files move first, markers after, so a
    kill at any point leaves only things the next call moves as well.
    """
    live: set[int] = set()
    stale: list[int] = []
    for marker_path in (
        sorted(output.markers_dir.glob("*.json")) if output.markers_dir.is_dir() else []
    ):
        try:
            marker = BatchSummary.from_json(orjson.loads(marker_path.read_bytes()))
        except (OSError, orjson.JSONDecodeError, TypeError):
            stale.append(-1)
            continue
        i = marker.index
        if i < len(batches) and marker.input_key == batches[i].key:
            live.add(i)
        else:
            stale.append(i)
    tag = f"{time.time_ns():x}"
    for d in (output.dir, output.rejects_dir):  # files a kill left half written
        for tmp in d.glob(".part-*.tmp-*") if d.is_dir() else []:
            tmp.unlink(missing_ok=True)
    for path in [*output.shard_paths(), *sorted(output.rejects_dir.glob("part-*.parquet"))]:
        try:
            index = int(path.stem.removeprefix("part-"))
        except ValueError:
            continue
        if index not in live:
            prefix = "" if path.parent == output.dir else "rejects-"
            dest = output.superseded_dir
            dest.mkdir(parents=True, exist_ok=True)
            path.replace(dest / f"{prefix}{path.stem}.{tag}{path.suffix}")
    for marker_path in (
        sorted(output.markers_dir.glob("*.json")) if output.markers_dir.is_dir() else []
    ):
        try:
            index = int(marker_path.stem)
        except ValueError:
            index = -1
        if index not in live:
            marker_path.unlink(missing_ok=True)
    return sorted(i for i in stale if i >= 0)


def build_pool(output: PartitionOutput) -> ReusePool:
    """Index the superseded shards and every journal by prompt key."""
    pool = ReusePool()
    if output.superseded_dir.is_dir():
        for path in sorted(output.superseded_dir.glob("*.parquet")):
            records = path.name.startswith("part-")
            columns = ["id", "prompt_ids"] if records else ["id", "prompt_ids", "stage"]
            try:
                names = pq.read_schema(path).names
                if "images" in names:  # shards written before image prompts have none
                    columns.append("images")
                table = pq.read_table(path, columns=columns)
            except (OSError, ValueError):
                continue  # unreadable: those prompts are simply sent again
            file_no = len(pool.files)
            pool.files.append(path)
            ids = table.column("id").to_pylist()
            prompts = table.column("prompt_ids").to_pylist()
            stages = table.column("stage").to_pylist() if not records else None
            images = (
                table.column("images").to_pylist() if "images" in columns else [None] * len(ids)
            )
            for row, (pid, prompt_ids) in enumerate(zip(ids, prompts, strict=True)):
                if pid is None or prompt_ids is None:
                    continue
                if stages is not None and stages[row] not in _REQUEST_STAGES:
                    continue
                digests = [image["sha256"] for image in images[row] or []]
                pool.index.setdefault(prompt_key(pid, prompt_ids, digests), (file_no, row))
    if output.journal_dir.is_dir():
        for path in sorted(output.journal_dir.glob("*.jsonl")):
            pool.journaled.update(BatchJournal(path).load())
    return pool


def record_input(output: PartitionOutput, info: InputInfo) -> None:
    """Write what the partition's data was made from (the manifest reads it from there)."""
    output.dir.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(output.input_path, orjson.dumps(info.to_json(), option=orjson.OPT_INDENT_2))


def prepare_partition(
    output: PartitionOutput, batches: list[BatchSpec], info: InputInfo
) -> tuple[ReusePool, list[int]]:
    """Make the partition's directory describe the current input before any batch runs.

    Returns the pool of reusable earlier results and the indexes of superseded batches.
    """
    stale = supersede_stale(output, batches)
    record_input(output, info)
    return build_pool(output), stale


def superseded_line(partition: str, superseded: list[int], reusable: int) -> str:
    """The log line of a rerun whose input changed."""
    shown = ", ".join(str(i) for i in superseded[:10]) + (" ..." if len(superseded) > 10 else "")
    return (
        f"{partition}: the input changed since the last run: {len(superseded)} committed "
        f"batches no longer match it ({shown}) and were taken out of the dataset; "
        f"{reusable} of their results are reused for prompts that are still there"
    )


def done_lines(output: PartitionOutput, batches: list[BatchSpec]) -> int:
    """Input lines of the batches earlier runs committed from the input as it is now."""
    return sum(b.count for b in batches if output.committed(b.index, b.key) is not None)


def reuse_line(partition: str, done: int, total: int, reusable: int) -> str:
    """The line of a rerun into an existing output: what earlier runs did that this one keeps
    (their batches are not sent again), and what is left to generate."""
    line = (
        f"{partition}: reusing {done:,} of {total:,} lines done by earlier runs; "
        f"{total - done:,} left"
    )
    if reusable and done < total:
        line += f" ({reusable:,} earlier results at hand for prompts among them)"
    return line


def drop_superseded(output: PartitionOutput) -> None:
    """Delete what the partition kept for reuse, once every batch of it is committed."""
    shutil.rmtree(output.superseded_dir, ignore_errors=True)
    shutil.rmtree(output.journal_dir, ignore_errors=True)


def still_on_disk(output_dir: str, name: str, size: int | None) -> dict[str, Any] | None:
    """A partition an earlier attempt of a retried run completed: its totals when the output
    directory still holds all its lines (``size``, the input's, when known), so it is reused;
    None when something deleted them since (an ``--overwrite``): then it runs again."""
    summary = summarize_on_disk(output_dir, name)
    lines = int(summary.get("input_lines", 0))
    return summary if lines and (size is None or lines >= size) else None
