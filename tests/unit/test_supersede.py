"""Which failed-batches tables a later success supersedes: the library's policy, without an
orchestrator (``flows/failed_batches.py`` reads the versions and writes what it decides)."""

from __future__ import annotations

from eagle3_datagen.report.supersede import FailedTable, supersede
from eagle3_datagen.report.ui import SUPERSEDED

BY = "run 'nightly' (attempt 1)"


def test_a_success_supersedes_the_tables_of_its_directory_that_it_covers() -> None:
    tables = [
        FailedTable("old", "/data/out", "1 batch of a failed", frozenset({"a"})),
        FailedTable("both", "/data/out/", "2 batches failed", frozenset({"a", "b"})),
        FailedTable("elsewhere", "/other", "1 batch of a failed", frozenset({"a"})),
        FailedTable("unknown", None, "1 batch of a failed", frozenset({"a"})),
    ]
    decided = supersede(tables, latest="both", output_dir="/data/out", covered={"a"}, by=BY)
    # Only the table whose every partition this run completed, written into this directory.
    assert set(decided.descriptions) == {"old"}
    assert decided.descriptions["old"].startswith(f"{SUPERSEDED} by {BY}")
    assert decided.descriptions["old"].endswith("was: 1 batch of a failed")
    assert decided.new_version is None  # the latest ("both") still lists b


def test_the_latest_superseded_gets_an_empty_version_that_says_so() -> None:
    tables = [FailedTable("t1", "~/out", "3 batches failed")]  # a partition's own table
    decided = supersede(tables, latest="t1", output_dir="~/out", covered={"p"}, by=BY)
    assert set(decided.descriptions) == {"t1"}
    assert decided.new_version is not None and decided.new_version.startswith(SUPERSEDED)


def test_a_table_already_superseded_keeps_the_first_word() -> None:
    said = f"{SUPERSEDED} by run 'earlier': all batches committed; was: 1 failed"
    tables = [FailedTable("t1", "/out", said)]
    decided = supersede(tables, latest="new-empty", output_dir="/out", covered=set(), by=BY)
    assert decided.descriptions == {} and decided.new_version is None
