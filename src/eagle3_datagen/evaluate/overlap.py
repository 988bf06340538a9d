"""Whether the draft trained on what eval measures it on: the eval records' conversations
against the training file of the draft's export (its ``<stem>.provenance.json``,
``write/export_provenance.py``).

Why: only the export knows what went into training; an eval that cannot see it cannot promise
its number is on unseen prompts. With ``--train-export`` (or a draft directory holding the
provenance file) any overlap is refused before a request is sent; without, the result says
"overlap not checked", in its output and its JSON.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from eagle3_datagen.errors import DatasetError
from eagle3_datagen.write.export_provenance import SUFFIX, conversation_digest, read_provenance

NOT_CHECKED = (
    "overlap not checked: eval cannot know what the draft trained on (pass --train-export "
    "with the export the draft was trained on)"
)


def provenance_source(train_export: str | None, draft: str | None) -> str | None:
    """``--train-export``, else the draft directory when it holds one provenance file."""
    if train_export:
        return train_export
    if draft and Path(draft).is_dir() and len(list(Path(draft).glob(f"*{SUFFIX}"))) == 1:
        return draft
    return None


def check_overlap(
    conversations: Iterable[tuple[str, str]], train_export: str | None, draft: str | None
) -> dict[str, Any]:
    """The ``overlap`` block of the result; an eval conversation in the training file is
    refused, naming how many and the first few."""
    source = provenance_source(train_export, draft)
    if source is None:
        return {"checked": False, "reason": NOT_CHECKED}
    file, data, trained = read_provenance(source)
    keys = sorted(set(conversations))
    seen = [k for k in keys if conversation_digest(*k) in trained]
    if seen:
        shown = ", ".join(f"{p}/{c}" for p, c in seen[:3])
        raise DatasetError(
            f"{len(seen)} of {len(keys)} eval conversations ({shown}"
            f"{', ...' if len(seen) > 3 else ''}) are in the training file of {file}: the "
            "draft trained on them; export the dataset the default way (it leaves the "
            "held-out split out) and train on that"
        )
    return {
        "checked": True,
        "train_export": str(file),
        "split": data.get("split"),
        "dataset_content_sha256": (data.get("dataset") or {}).get("content_sha256"),
        "conversations_in_training": 0,
        "reason": f"none of {len(keys)} eval conversations is in {file.name}'s training file",
    }
