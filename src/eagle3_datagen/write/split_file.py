"""The dataset's own held-out split, recorded in ``split.json`` beside ``manifest.json``.

Why: a split given as a flag to each command is a different split per command (a hash
threshold: the 0.2 set contains the 0.05 one), so an eval could measure a draft on prompts an
export with another flag trained it on, and nothing would say so. The first ``export``,
``select`` or ``eval`` of a dataset fixes its split (fraction, seed, rule, the held-out
conversation keys and those moved to train); every later one uses it. A grown dataset keeps
its earlier held-out conversations held out (``heldout.split``'s ``held_before``); a
``--validation`` or seed that differs is refused unless ``--resplit`` asks for a new split,
whose cost the message names.

The fraction and the eval's minimum are chosen together: 5 % of conversations and at least 50
held-out records (``evaluate/records.py``), so a dataset of about a thousand single-turn
prompts or more evaluates, and the demo (84 records) is refused with the reason.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson

from eagle3_datagen.errors import DatasetError
from eagle3_datagen.write.heldout import PROMPT_KEY, SPLIT_KEY, HeldOut
from eagle3_datagen.write.shards import atomic_write_bytes

SPLIT_FILE = "split.json"
DEFAULT_VALIDATION = 0.05
DEFAULT_SEED = 0
RULE = (
    "a conversation is held out when sha256(seed, partition, conversation_id) / 2^64 < "
    "validation; a newly held-out conversation whose first prompt a training one repeats moves "
    "to train; a new conversation whose first prompt an earlier held-out one has is held out; "
    "earlier held-out conversations stay held out"
)
RESPLIT_COST = (
    "drafts trained on exports of the old split can no longer be evaluated on this dataset "
    "(their training files may hold the new held-out conversations)"
)

Key = tuple[str, str]


@dataclass(frozen=True, slots=True)
class SplitChoice:
    """The split a command uses: the recorded one, or a new one it will record."""

    validation: float
    seed: int
    id: str
    created: str
    held_before: frozenset[Key] = frozenset()
    moved_before: frozenset[Key] = frozenset()
    recorded: bool = False  # read from split.json (False: new, written on success)


def split_path(root: str | Path) -> Path:
    return Path(root) / SPLIT_FILE


def _keys(value: Any, path: Path, name: str) -> frozenset[Key]:
    if not isinstance(value, list) or not all(
        isinstance(k, list) and len(k) == 2 and all(isinstance(x, str) for x in k) for k in value
    ):
        raise DatasetError(f"{path}: {name} must be a list of [partition, conversation_id]")
    return frozenset((k[0], k[1]) for k in value)


def _read(root: str | Path) -> SplitChoice | None:
    path = split_path(root)
    try:
        data = orjson.loads(path.read_bytes())
    except FileNotFoundError:
        return None
    except (OSError, orjson.JSONDecodeError) as err:
        raise DatasetError(f"{path}: cannot read the dataset's split: {err}") from None
    try:
        return SplitChoice(
            validation=float(data["validation"]),
            seed=int(data["seed"]),
            id=str(data["id"]),
            created=str(data["created"]),
            held_before=_keys(data["held_out"], path, "held_out"),
            moved_before=_keys(data["moved_to_train"], path, "moved_to_train"),
            recorded=True,
        )
    except (KeyError, TypeError, ValueError) as err:
        raise DatasetError(f"{path}: not a split file (missing or bad {err})") from None


def _new_id(validation: float, seed: int, created: str) -> str:
    return hashlib.sha256(f"{validation}\0{seed}\0{created}".encode()).hexdigest()[:12]


def choose_split(
    root: str | Path,
    validation: float | None = None,
    seed: int | None = None,
    *,
    resplit: bool = False,
    seed_flag: str = "--split-seed",
) -> SplitChoice:
    """The dataset's recorded split; a new one (``validation`` or the default fraction) where
    none is recorded or ``resplit`` asks; a ``validation`` or ``seed`` differing from the
    recorded one is refused in one line naming ``--resplit`` and its cost."""
    if validation is not None and not 0.0 < validation < 1.0:
        raise DatasetError(f"--validation must be in (0, 1), got {validation}")
    rec = None if resplit else _read(root)
    if rec is not None:
        differs = []
        if validation is not None and validation != rec.validation:
            differs.append(f"--validation {validation}")
        if seed is not None and seed != rec.seed:
            differs.append(f"{seed_flag} {seed}")
        if differs:
            raise DatasetError(
                f"{' and '.join(differs)} {'differ' if len(differs) > 1 else 'differs'} from "
                f"the dataset's split ({split_path(root)}: "
                f"validation {rec.validation}, seed {rec.seed}, id {rec.id}); leave them out to "
                f"use it, or pass --resplit to re-split on purpose: {RESPLIT_COST}"
            )
        return rec
    fraction = DEFAULT_VALIDATION if validation is None else validation
    chosen_seed = DEFAULT_SEED if seed is None else seed
    created = datetime.now(UTC).isoformat(timespec="seconds")
    return SplitChoice(fraction, chosen_seed, _new_id(fraction, chosen_seed, created), created)


def split_summary(choice: SplitChoice, held: HeldOut) -> dict[str, Any]:
    """The split as exports, eval and the provenance file name it."""
    return {
        **held.summary(),
        "id": choice.id,
        "file": SPLIT_FILE,
        "recorded": choice.recorded,
    }


def save_split(root: str | Path, choice: SplitChoice, held: HeldOut) -> bool:
    """Record the split (atomically) when it is new or the dataset grew; True when written."""
    held_out = held.held_out_keys()
    moved = sorted(held.moved)
    if (
        choice.recorded
        and set(held_out) <= choice.held_before
        and set(moved) <= choice.moved_before
    ):
        return False
    data = {
        "id": choice.id,
        "created": choice.created,
        "updated": datetime.now(UTC).isoformat(timespec="seconds"),
        "validation": choice.validation,
        "seed": choice.seed,
        "key": SPLIT_KEY,
        "rule": RULE,
        "duplicate_key": PROMPT_KEY,
        "conversations": held.conversations,
        # Earlier keys stay recorded even if their records are gone (a partition rerun).
        "held_out": [list(k) for k in sorted(set(held_out) | choice.held_before)],
        "moved_to_train": [list(k) for k in sorted(set(moved) | choice.moved_before)],
    }
    atomic_write_bytes(split_path(root), orjson.dumps(data, option=orjson.OPT_INDENT_2))
    return True
