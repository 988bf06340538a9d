"""What an export trained on, in a small file beside its JSONL (``<stem>.provenance.json``),
so ``eagle3-datagen eval --train-export`` can prove its eval records are none of them.

Why: a trainer's file holds token ids only (SpecForge's rows have no id at all), so without
this file eval cannot know which conversations a draft saw. The file names the dataset (its
content hash), the split the export held out (its id), the rows of each file and a digest of
each trained conversation's key (partition + ``conversation_id``: a fixed-size name, whatever
the ids hold).
"""

from __future__ import annotations

import hashlib
from collections import Counter
from pathlib import Path
from typing import Any

import orjson

from eagle3_datagen.errors import DatasetError
from eagle3_datagen.write.dataset_dir import DatasetDir
from eagle3_datagen.write.export_plan import Plan
from eagle3_datagen.write.heldout import TRAIN

KIND = "eagle3-datagen export provenance"
SUFFIX = ".provenance.json"


def conversation_digest(partition: str, conversation: str) -> str:
    """A conversation key's fixed-size name (16 hex digits of BLAKE2b)."""
    key = f"{partition}\0{conversation}".encode()
    return hashlib.blake2b(key, digest_size=8).hexdigest()


def provenance(ds: DatasetDir, plan: Plan, written: Counter[str], out: Path) -> dict[str, Any]:
    """The provenance of an export whose plan is ``plan`` and whose files got ``written``."""
    trained = [key for key, side in plan.groups.items() if side == TRAIN]
    return {
        "kind": KIND,
        "training_file": out.name,
        "dataset": {"content_sha256": ds.content_sha256},
        "split": (
            {
                "id": plan.choice.id,
                "validation": plan.choice.validation,
                "seed": plan.choice.seed,
            }
            if plan.choice is not None and plan.held is not None
            else None
        ),
        "held_out": plan.held is not None,
        "rows": {"train": written["train"], "validation": written["validation"]},
        "train_conversations": {
            "count": len(trained),
            "digest": "blake2b-64 of partition NUL conversation_id",
            "digests": sorted(conversation_digest(*k) for k in trained),
        },
    }


def find_provenance(path: str | Path) -> Path:
    """The provenance file ``path`` names: the file itself, the one beside a training JSONL,
    or the only one in a directory (a draft directory the export was copied into)."""
    p = Path(path)
    if p.is_dir():
        found = sorted(p.glob(f"*{SUFFIX}"))
        if len(found) != 1:
            what = "no" if not found else f"{len(found)}"
            raise DatasetError(
                f"--train-export {p}: {what} *{SUFFIX} files in the directory; name the "
                "export's JSONL or its provenance file"
            )
        return found[0]
    if p.name.endswith(SUFFIX):
        return p
    beside = p.with_name(f"{p.stem}{SUFFIX}")
    if not beside.exists():
        raise DatasetError(
            f"--train-export {p}: no {beside.name} beside it (an export from before provenance "
            "files: export it again)"
        )
    return beside


def read_provenance(path: str | Path) -> tuple[Path, dict[str, Any], set[str]]:
    """The provenance file, its content and its trained conversations' digests."""
    file = find_provenance(path)
    try:
        data = orjson.loads(file.read_bytes())
        digests = set(data["train_conversations"]["digests"])
    except FileNotFoundError:
        raise DatasetError(f"--train-export {file}: no such file") from None
    except (OSError, orjson.JSONDecodeError, KeyError, TypeError) as err:
        raise DatasetError(f"--train-export {file}: not an export provenance file: {err}") from None
    return file, data, digests
