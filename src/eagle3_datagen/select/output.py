"""Writing a selection: a dataset like any other (shards, commit markers, manifest), holding the
source's records of the kept conversations, byte for byte, under the source's fingerprint, and
a ``selection`` block in the manifest naming the source, the rule, its parameters and seed.

Idempotent and resumable: the request is written first (``_selection.json``); a rerun with the
same request skips the shards already committed and finishes the rest (a finished one says so
and writes nothing); a different request into the same directory is refused, naming what
differs. Each source shard gives one shard (the same index) of its kept records; the selection
keeps no rejects (they are not training data; the source keeps them). The dataset card
(README.md) is written as for a run, with the selection in its provenance.

The source's held-out split (``split.json``; fixed here when the source has none) is never
ranked: the rule chooses among training conversations only, every held-out conversation is
copied as it is, and the source's ``split.json`` goes with them. So an export of the selection
holds out exactly the source's eval set, and drafts trained on selections by different rules
are measured on the same prompts, none of which any of them trained on.
"""

from __future__ import annotations

import datetime as dt
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.parquet as pq

from eagle3_datagen.errors import DatasetError
from eagle3_datagen.provenance import pipeline_version
from eagle3_datagen.report.dataset_card import refresh_dataset_card
from eagle3_datagen.select.choose import (
    PartitionChoice,
    choose,
    committed_shards,
    kept_mask,
    select_rule,
    tally,
)
from eagle3_datagen.write.dataset_dir import DatasetDir, Shard
from eagle3_datagen.write.export_plan import held_out, scan
from eagle3_datagen.write.heldout import VALIDATION, HeldOut
from eagle3_datagen.write.manifest import MANIFEST, summarize, write_manifest
from eagle3_datagen.write.records import RECORD_SCHEMA
from eagle3_datagen.write.shards import (
    BatchSummary,
    PartitionOutput,
    atomic_write_bytes,
    atomic_write_parquet,
)
from eagle3_datagen.write.split_file import choose_split, save_split, split_path

REQUEST = "_selection.json"


@dataclass(frozen=True, slots=True)
class SelectRequest:
    """What decides a selection's records: the source (path and content), rule, fraction, seed."""

    source: str
    source_content_sha256: str
    rule: str
    params: dict[str, Any]
    keep: float
    seed: int
    split: str = ""  # the source's held-out split id (split.json)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(slots=True)
class SelectOutcome:
    root: Path
    request: SelectRequest
    partitions: dict[str, PartitionChoice]
    already_done: bool = False
    held_out: dict[str, set[str]] | None = None  # per partition: the source's held-out ones


def select_dataset(
    source: str | Path, output: str | Path, rule_name: str, keep: float, seed: int = 0
) -> SelectOutcome:
    """Write the selection of ``source`` by ``rule_name`` (``keep``: the fraction of each
    partition's conversations) to ``output``; DatasetError for any reason it cannot."""
    if not 0.0 < keep <= 1.0:
        raise DatasetError(f"--keep must be in (0, 1], got {keep}")
    src = DatasetDir(source)
    root = Path(output)
    if root.resolve() == src.root.resolve():
        raise DatasetError(f"--output {root} is the source dataset: choose a new directory")
    shards = committed_shards(src)
    rule = select_rule(shards, rule_name)
    choice = choose_split(src.root)
    held = held_out(list(scan([s for p in shards.values() for s in p], prompts=True)), choice)
    request = SelectRequest(
        str(src.root.resolve()), src.content_sha256, rule.name, rule.params, keep, seed, choice.id
    )
    done = _claim(root, request)
    kept_out = _held_out_by_partition(held, shards)
    choices = {
        name: choose(name, _training(tally(s, rule), kept_out[name]), rule, keep, seed)
        for name, s in shards.items()
    }
    if done:
        return SelectOutcome(root, request, choices, already_done=True, held_out=kept_out)
    save_split(src.root, choice, held)
    atomic_write_bytes(split_path(root), split_path(src.root).read_bytes())
    summaries = {
        name: _write_partition(root, name, shards[name], choices[name].kept | kept_out[name])
        for name in shards
    }
    manifest = {
        "first_written": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "fingerprint": src.fingerprint,
        "status": "completed",
        "partitions": {
            n: {**s, **_input(src, n), "status": "completed"} for n, s in summaries.items()
        },
        "selection": {
            **request.to_dict(),
            "summary": rule.summary,
            "partitions": {
                n: {**c.to_dict(), "held_out_copied": len(kept_out[n])} for n, c in choices.items()
            },
            "pipeline_version": pipeline_version(),
        },
    }
    write_manifest(root, manifest)
    refresh_dataset_card(root, manifest)
    return SelectOutcome(root, request, choices, held_out=kept_out)


def _held_out_by_partition(held: HeldOut, shards: dict[str, list[Shard]]) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {name: set() for name in shards}
    for (partition, conversation), side in held.sides.items():
        if side == VALIDATION and partition in out:
            out[partition].add(conversation)
    return out


def _training(groups: dict[str, Any], held: set[str]) -> dict[str, Any]:
    """The conversations a rule may rank: the source's held-out ones never are."""
    return {conv: t for conv, t in groups.items() if conv not in held}


def _input(src: DatasetDir, name: str) -> dict[str, Any]:
    """The source partition's input file (path, size, SHA-256, lines), for `validate --input`."""
    entry = src.manifest_entry(name) or {}
    return {"input": entry["input"]} if entry.get("input") else {}


def _claim(root: Path, request: SelectRequest) -> bool:
    """Record the request in ``root`` (True: this very selection is already complete there);
    refuse a directory that holds anything else."""
    path = root / REQUEST
    want = request.to_dict()
    if path.exists():
        have = orjson.loads(path.read_bytes())
        differ = [k for k in want if have.get(k) != want[k]]
        if differ:
            changes = ", ".join(f"{k}: {have.get(k)!r} -> {want[k]!r}" for k in differ)
            raise DatasetError(
                f"{root} holds another selection ({changes}): choose a new --output directory"
            )
        manifest = root / MANIFEST
        return (
            manifest.exists() and orjson.loads(manifest.read_bytes()).get("status") == "completed"
        )
    if root.exists() and any(root.iterdir()):
        raise DatasetError(f"{root} exists and is not a selection's output: choose a new --output")
    root.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(path, orjson.dumps(want, option=orjson.OPT_INDENT_2))
    return False


def _write_partition(root: Path, name: str, shards: list[Shard], kept: set[str]) -> dict[str, Any]:
    """One shard and marker per source shard (a committed one is left as it is)."""
    out = PartitionOutput(root, name)
    for shard in shards:
        if out.committed(shard.index, shard.marker.input_key) is None:
            _write_shard(out, shard, kept)
    return summarize(name, out.batch_summaries())


def _write_shard(out: PartitionOutput, shard: Shard, kept: set[str]) -> None:
    pf = pq.ParquetFile(shard.path)
    table = pf.read()
    column = "conversation_id" if "conversation_id" in table.column_names else "id"
    table = _as_records(table.filter(kept_mask(table, column, kept)))
    metadata = {k.decode(): v.decode() for k, v in (pf.schema_arrow.metadata or {}).items()}
    out.ensure_dirs()
    atomic_write_parquet(out.shard_path(shard.index), table, metadata)
    atomic_write_bytes(
        out.marker_path(shard.index),
        orjson.dumps(asdict(_marker(shard.marker, table)), option=orjson.OPT_INDENT_2),
    )


def _as_records(table: pa.Table) -> pa.Table:
    """The rows in today's record schema: columns older shards lack are null."""
    n = table.num_rows
    arrays = [
        table.column(f.name).cast(f.type) if f.name in table.column_names else pa.nulls(n, f.type)
        for f in RECORD_SCHEMA
    ]
    return pa.Table.from_arrays(arrays, schema=RECORD_SCHEMA)


def _marker(source: BatchSummary, table: pa.Table) -> BatchSummary:
    """The source batch's marker for the kept records: the same lines it covered, counts of
    what it holds now (no rejects)."""
    rows = table.select(
        ["prompt_ids", "output_ids", "truncated", "think_end_index", "turn", "sample",
         "conversation_id", "stop_reason"]
    ).to_pylist()  # fmt: skip
    m = BatchSummary(
        source.partition, source.index, source.first_line, source.lines,
        requests_sent=0, wall_s=0.0, input_key=source.input_key,
    )  # fmt: skip
    m.accepted = len(rows)
    for r in rows:
        m.truncated += bool(r["truncated"])
        m.prompt_tokens += len(r["prompt_ids"])
        m.output_tokens += len(r["output_ids"])
        m.output_lengths.append(len(r["output_ids"]))
        if r["think_end_index"] >= 0:
            m.thinking_lengths.append(r["think_end_index"])
    m.records_by_turn = dict(Counter(str(r["turn"] or 0) for r in rows))
    m.conversations = len({(r["conversation_id"], r["sample"]) for r in rows})
    stops = Counter(r["stop_reason"] for r in rows if r["stop_reason"])
    m.stopped, m.stops_by_reason = sum(stops.values()), dict(stops)
    return m
