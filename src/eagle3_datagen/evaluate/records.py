"""The held-out records eval sends, each with the sampling its generation request had.

The split is the dataset's own (``split.json``, ``write/split_file.py``; the rule in
``write/heldout.py``), computed over the whole dataset, so a draft trained on any export of it
made the default way never saw these prompts. Fewer than a minimum of records (``MIN_RECORDS``,
chosen with the split's default fraction) is refused before anything is sent: an accept length
over a handful of prompts moves by tenths between samples, and a gate on it fires on noise.
Image records are left out, as the exports leave them out: the dataset keeps each image's
hash, not its bytes, so their requests cannot be sent again as they were.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from eagle3_datagen.config import Sampling
from eagle3_datagen.errors import DatasetError
from eagle3_datagen.render.token_ids import TokenIds
from eagle3_datagen.write.dataset_dir import DatasetDir, iter_rows
from eagle3_datagen.write.export_plan import committed_shards, held_out, present_columns, scan
from eagle3_datagen.write.heldout import VALIDATION, HeldOut
from eagle3_datagen.write.split_file import SplitChoice

MIN_RECORDS = 50

_COLUMNS = (
    "id",
    "conversation_id",
    "turn",
    "prompt_ids",
    "sampling",
    "images",
    "has_tools",
    "mode",
)
_SAMPLING_KEYS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")


@dataclass(frozen=True, slots=True)
class HeldOutRecord:
    """One held-out request: the stored prompt, the request's sampling, what to slice it by."""

    partition: str
    id: str
    conversation: str
    turn: int
    prompt_ids: list[int]
    sampling: dict[str, Any]
    has_tools: bool | None  # the prompt declared tools (None: a dataset from before the column)
    mode: str | None = None  # the line's serving mode (None: a dataset from before the column)


@dataclass(slots=True)
class HeldOutSet:
    split: HeldOut
    records: list[HeldOutRecord]
    images_left_out: int

    def conversations(self) -> int:
        return len({(r.partition, r.conversation) for r in self.records})

    def counts(self) -> dict[str, int]:
        """What eval sends, as its JSON's ``heldout`` holds it."""
        return {
            "conversations": self.conversations(),
            "records": len(self.records),
            "moved_to_train": self.split.duplicates_moved,
            "images_left_out": self.images_left_out,
        }


def _tier_tokens(ds: DatasetDir, partition: str) -> int | None:
    """The max_tokens of the partition's tier, from the fingerprint (for shards without a
    ``sampling`` column)."""
    tier = (ds.content.get("tiers") or {}).get(partition) or {}
    return tier.get("max_tokens")


def request_sampling(
    ds: DatasetDir, partition: str, stored: dict[str, Any] | None, ids: TokenIds
) -> dict[str, Any]:
    """The ``sampling_params`` of a held-out request: the record's own sampling as stored
    (temperature, top_p, ..., its ``max_new_tokens`` and seed), else the run's config, with
    the run's stop tokens, never trimmed (as the generation request had them)."""
    base = dict(ds.content.get("sampling") or {})
    stored = stored or {}
    values = {k: stored[k] if stored.get(k) is not None else base.get(k) for k in _SAMPLING_KEYS}
    try:
        sampling = Sampling(**{k: v for k, v in values.items() if v is not None})
    except ValueError as err:
        where = f"{ds.manifest_path}: unusable sampling for {partition}"
        raise DatasetError(f"{where}: {err}") from None
    max_new = stored.get("max_new_tokens") or _tier_tokens(ds, partition)
    if not max_new:
        raise DatasetError(
            f"{ds.manifest_path}: no max_new_tokens for {partition} (neither in its records' "
            "sampling nor in the fingerprint's tiers)"
        )
    params = sampling.to_sglang(int(max_new), list(ids.stop_ids))
    if stored.get("sampling_seed") is not None:
        params["sampling_seed"] = int(stored["sampling_seed"])
    return params


def _rows(ds: DatasetDir, held: HeldOut) -> Iterator[tuple[str, dict[str, Any]]]:
    for shard in committed_shards(ds):
        for row in iter_rows(shard.path, present_columns(shard.path, _COLUMNS)):
            conversation = row.get("conversation_id") or row["id"]
            if held.side(shard.partition, conversation) == VALIDATION:
                yield shard.partition, row


def held_out_records(
    ds: DatasetDir, ids: TokenIds, choice: SplitChoice, min_records: int = MIN_RECORDS
) -> HeldOutSet:
    """The held-out records of the dataset under its split; fewer than ``min_records`` is an
    error naming how many there are and why."""
    held = held_out(list(scan(committed_shards(ds), prompts=True)), choice)
    records, images = [], 0
    for partition, row in _rows(ds, held):
        if row.get("images"):
            images += 1
            continue
        records.append(
            HeldOutRecord(
                partition=partition,
                id=str(row["id"]),
                conversation=str(row.get("conversation_id") or row["id"]),
                turn=int(row.get("turn") or 0),
                prompt_ids=row["prompt_ids"],
                sampling=request_sampling(ds, partition, row.get("sampling"), ids),
                has_tools=row.get("has_tools"),
                mode=row.get("mode"),
            )
        )
    if len(records) < max(1, min_records):
        raise DatasetError(_too_few(ds, held, choice, len(records), images, min_records))
    return HeldOutSet(held, records, images)


def _too_few(
    ds: DatasetDir, held: HeldOut, choice: SplitChoice, records: int, images: int, minimum: int
) -> str:
    why = [
        f"{held.validation_conversations} of {held.conversations} conversations held out at "
        f"validation {choice.validation} (seed {choice.seed})"
    ]
    if held.duplicates_moved:
        why.append(f"{held.duplicates_moved} moved to train as repeated prompts")
    if images:
        why.append(f"{images} image records left out")
    return (
        f"{ds.root}: {records} held-out records, fewer than the minimum {minimum} "
        f"(--min-records): {', '.join(why)}; an accept length over so few prompts is noise. "
        "Grow the dataset, lower --min-records (a wider interval), or pass --resplit with a larger "
        "--validation (drafts trained on the old split can then no longer be evaluated here)"
    )
