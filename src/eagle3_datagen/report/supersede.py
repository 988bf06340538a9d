"""Which failed-batches tables a later success supersedes, and what each then says.

An operator's Artifacts page shows each key's latest version, whichever run made it. So when a
run completes partitions, the earlier versions that listed failures of those partitions only,
made by runs that wrote into the same output directory, say which run superseded them; and
when the key's latest version is one of them, a new empty version says so too (the latest is
what the page shows). A table of another output directory, or one that still lists a
partition this run did not complete, stays as it is. No Prefect here: the flow reads the
versions and writes what this decides.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from eagle3_datagen.report.ui import SUPERSEDED, superseded_description


@dataclass(frozen=True, slots=True)
class FailedTable:
    """One version of a failed-batches table."""

    id: Any
    output_dir: str | None  # where the run that made it wrote; None when unknown
    description: str = ""
    # The partitions whose failures it lists; empty for a partition's own table (its key says
    # which partition).
    partitions: frozenset[str] = field(default_factory=frozenset)


@dataclass(frozen=True, slots=True)
class Supersession:
    """What to write: new descriptions for versions, and a new empty version's description
    (None: the key's latest version is not superseded, no new version)."""

    descriptions: dict[Any, str]
    new_version: str | None


def same_dir(path: str) -> str:
    """A directory as runs may spell it (``~``, relative): one absolute form."""
    return os.path.abspath(os.path.expanduser(path))


def supersede(
    failed: list[FailedTable], latest: Any, output_dir: str, covered: set[str], by: str
) -> Supersession:
    """The versions of one key that listed failures (``failed``; ``latest`` is the id of the
    key's latest version, failed or not) superseded by ``by``, a run into ``output_dir`` that
    completed the partitions ``covered``."""
    here = same_dir(output_dir)
    superseded = [
        table
        for table in failed
        if table.output_dir is not None
        and same_dir(table.output_dir) == here
        and table.partitions <= covered
    ]
    descriptions = {
        table.id: superseded_description(by, table.description)
        for table in superseded
        if not table.description.startswith(SUPERSEDED)  # said once, by the first success
    }
    latest_superseded = any(table.id == latest for table in superseded)
    return Supersession(descriptions, superseded_description(by, "") if latest_superseded else None)
