"""Which records an export takes, and on which side of the validation split: read from the
committed shards without the token lists' values, then decided by the export's options.

Left out, in this order: image records, by design (``IMAGES_LEFT_OUT``); truncated records
under ``--truncated drop``; records longer than the max length under ``--over-length drop``.
What is left is what the export writes, so every count the report gives can be checked
against the rows read back.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, get_args

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from eagle3_datagen.errors import DatasetError
from eagle3_datagen.write.dataset_dir import DatasetDir, Shard
from eagle3_datagen.write.heldout import (
    TRAIN,
    VALIDATION,
    Conversation,
    HeldOut,
    in_validation,
    prompt_keys,
    split,
)
from eagle3_datagen.write.split_file import SplitChoice

__all__ = ["HeldOut", "in_validation"]

Policy = Literal["keep", "drop", "refuse"]
POLICIES: tuple[str, ...] = get_args(Policy)

IMAGES_LEFT_OUT = (
    "image records are left out: these exports are token ids only, and the trainer would compute "
    "the target's hidden states on the image placeholder id instead of the image (docs/images.md)"
)


@dataclass(frozen=True, slots=True)
class ExportOptions:
    """What to do with truncated and over-long records, and the held-out split: the dataset's
    (``split.json``), unless ``hold_out`` is False (nothing held out) or ``resplit``."""

    truncated: Policy = "keep"
    over_length: Policy = "keep"
    max_length: int | None = None  # None: the trainer's default
    validation: float | None = None  # None: the dataset's recorded split (or the default)
    split_seed: int | None = None  # None: the recorded seed (or 0)
    hold_out: bool = True  # False: every conversation trains (eval cannot use this export)
    resplit: bool = False  # replace the dataset's recorded split

    def __post_init__(self) -> None:
        for name in ("truncated", "over_length"):
            if getattr(self, name) not in POLICIES:
                raise DatasetError(f"{name} must be one of {list(POLICIES)}")
        if self.validation is not None and not 0.0 < self.validation < 1.0:
            hint = " (to hold nothing out: --no-holdout)" if self.validation == 0 else ""
            raise DatasetError(f"--validation must be in (0, 1), got {self.validation}{hint}")
        if not self.hold_out and (self.validation is not None or self.resplit):
            raise DatasetError("--no-holdout holds nothing out: drop --validation and --resplit")
        if self.max_length is not None and self.max_length < 2:
            raise DatasetError(f"max_length must be at least 2, got {self.max_length}")


@dataclass(frozen=True, slots=True)
class Entry:
    """What the export decides on, for one record (read without the token lists' values)."""

    partition: str
    id: str
    conversation: str
    length: int
    truncated: bool
    images: int = 0  # an image record: left out by design
    prompt: bytes | None = None  # a first turn's prompt key (heldout.py), when asked for

    @property
    def key(self) -> tuple[str, str]:
        return (self.partition, self.id)


@dataclass(slots=True)
class Plan:
    """The export's decisions. ``measured`` holds the records checked against the max length:
    every exported one, plus those ``--over-length drop`` left out (never image records, nor
    truncated ones ``--truncated drop`` left out)."""

    records: int  # every committed record of the dataset
    images: list[Entry]
    truncated: list[Entry]  # all truncated non-image records, whatever the policy
    dropped_truncated: int
    measured: list[Entry]
    over: list[Entry]  # of ``measured``
    dropped_over_length: int
    sides: dict[tuple[str, str], str] = field(default_factory=dict)
    groups: dict[tuple[str, str], str] = field(default_factory=dict)  # conversation -> side
    conversations: int = 0
    validation_conversations: int = 0
    held: HeldOut | None = None  # the dataset's split, when the export holds it out
    choice: SplitChoice | None = None


def present_columns(path: Path, columns: tuple[str, ...]) -> list[str]:
    """The wanted columns the shard has (shards of older versions lack the turn columns)."""
    try:
        names = set(pq.read_schema(path).names)
    except (OSError, ValueError):
        return list(columns)  # iter_rows names the file and the problem
    return [c for c in columns if c in names]


def committed_shards(ds: DatasetDir) -> list[Shard]:
    """Every committed shard; refuses data of another fingerprint (uncommitted shards are not
    part of the dataset and are left out, as a rerun would replace them)."""
    shards: list[Shard] = []
    for name in ds.partitions():
        committed, _ = ds.shards(name)
        for shard in committed:
            problem = ds.check_fingerprint(shard.path)
            if problem:
                raise DatasetError(f"{problem}; refusing to export (see eagle3-datagen validate)")
        shards.extend(committed)
    return shards


def _first_turn_prompts(batch: pa.RecordBatch) -> list[bytes | None]:
    """The prompt key of each first-turn record (older shards without ``turn``: every one)."""
    names = batch.schema.names
    turns = batch.column("turn").to_pylist() if "turn" in names else [0] * batch.num_rows
    images = None
    if "images" in names:
        images = [[i["sha256"] for i in im or ()] for im in batch.column("images").to_pylist()]
    keys = prompt_keys(batch.column("prompt_ids"), images)
    return [k if t == 0 else None for k, t in zip(keys, turns, strict=True)]


def _batch_entries(partition: str, batch: pa.RecordBatch, prompts: bool = False) -> Iterator[Entry]:
    lengths = pc.add(
        pc.list_value_length(batch.column("prompt_ids")),
        pc.list_value_length(batch.column("output_ids")),
    )
    ids = batch.column("id").to_pylist()
    names = batch.schema.names
    convs = batch.column("conversation_id").to_pylist() if "conversation_id" in names else ids
    images = (
        pc.list_value_length(batch.column("images")).to_pylist()
        if "images" in names
        else [None] * len(ids)
    )
    truncated = batch.column("truncated").to_pylist()
    keys = _first_turn_prompts(batch) if prompts else [None] * len(ids)
    rows = zip(ids, lengths.to_pylist(), convs, truncated, images, keys, strict=True)
    for i, n, c, t, k, p in rows:
        yield Entry(partition, i, c or i, n, bool(t), k or 0, p)


def scan(shards: list[Shard], prompts: bool = False) -> Iterator[Entry]:
    """Every record's id, conversation, length and truncated flag (lengths computed in Arrow,
    the token lists never become Python objects here); with ``prompts``, each first turn's
    prompt key too (for the held-out split)."""
    wanted = ("id", "conversation_id", "truncated", "prompt_ids", "output_ids", "images", "turn")
    for shard in shards:
        columns = present_columns(shard.path, wanted)
        try:
            for batch in pq.ParquetFile(shard.path).iter_batches(columns=columns):
                yield from _batch_entries(shard.partition, batch, prompts)
        except (pa.ArrowException, OSError, KeyError) as err:
            raise DatasetError(f"{shard.path}: cannot read: {err}") from None


def _refuse(what: str, entries: list[Entry], hint: str) -> DatasetError:
    shown = ", ".join(f"{e.partition}/{e.id}" for e in entries[:5])
    more = f" and {len(entries) - 5} more" if len(entries) > 5 else ""
    return DatasetError(f"refusing to export: {len(entries)} {what} ({shown}{more}); {hint}")


def _check_refusals(plan: Plan, opts: ExportOptions, max_length: int) -> None:
    if opts.truncated == "refuse" and plan.truncated:
        raise _refuse(
            "truncated records (finish_reason length)",
            plan.truncated,
            "pass --truncated keep or --truncated drop",
        )
    if opts.over_length == "refuse" and plan.over:
        longest = max(e.length for e in plan.over)
        raise _refuse(
            f"records longer than the max length {max_length}",
            plan.over,
            f"raise --max-length (the longest is {longest} tokens; the trainer must "
            "get the same value) or pass --over-length keep or drop",
        )


def held_out(entries: list[Entry], choice: SplitChoice) -> HeldOut:
    """The dataset's split (heldout.py, as ``split.json`` fixed it) over every record, whatever
    an export leaves out, so the export's validation side and eval's held-out records are the
    same conversations."""
    convs = (Conversation(e.partition, e.conversation, e.prompt) for e in entries)
    return split(convs, choice.validation, choice.seed, choice.held_before, choice.moved_before)


def _split(
    plan: Plan, entries: list[Entry], exported: list[Entry], choice: SplitChoice | None
) -> None:
    """Each exported record's side, by conversation (every turn and sample on one side)."""
    held = held_out(entries, choice) if choice is not None else None
    groups: dict[tuple[str, str], str] = {}
    for e in exported:
        group = (e.partition, e.conversation)
        groups[group] = held.side(*group) if held is not None else TRAIN
        plan.sides[e.key] = groups[group]
    plan.held, plan.choice, plan.groups = held, choice, groups
    n_val = sum(1 for side in groups.values() if side == VALIDATION)
    if held is not None and groups and n_val == len(groups):
        raise DatasetError(
            f"the dataset's split (validation {held.fraction}, seed {held.seed}) holds out all "
            f"{len(groups)} exported conversations: nothing would train; pass --resplit with a "
            "smaller --validation"
        )
    plan.conversations, plan.validation_conversations = len(groups), n_val


def make_plan(
    entries: list[Entry], opts: ExportOptions, max_length: int, choice: SplitChoice | None = None
) -> Plan:
    """Which records go where ("train" / "validation"), or a refusal naming them."""
    images = [e for e in entries if e.images]
    candidates = [e for e in entries if not e.images]
    truncated = [e for e in candidates if e.truncated]
    drop_truncated = opts.truncated == "drop"
    measured = [e for e in candidates if not (drop_truncated and e.truncated)]
    over = [e for e in measured if e.length > max_length]
    drop_over = opts.over_length == "drop"
    plan = Plan(
        records=len(entries),
        images=images,
        truncated=truncated,
        dropped_truncated=len(truncated) if drop_truncated else 0,
        measured=measured,
        over=over,
        dropped_over_length=len(over) if drop_over else 0,
    )
    _check_refusals(plan, opts, max_length)
    exported = [e for e in measured if not (drop_over and e.length > max_length)]
    _split(plan, entries, exported, choice)
    return plan
