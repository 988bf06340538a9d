"""The run's outcome policy, without Prefect: which failure is the run's reason, and what the
manifest entries, the summary table and the progress table say."""

from __future__ import annotations

from pathlib import Path

from eagle3_datagen.errors import OutputWriteError, RunFailed, ServerLost
from eagle3_datagen.report.outcome import RunOutcome
from eagle3_datagen.report.throughput import RunMeter


def test_all_completed_is_no_failure_and_says_completed():
    outcome = RunOutcome(["a", "b"])
    outcome.started()
    assert outcome.states == {"a": "running", "b": "running"}
    outcome.partition_completed("a", {"accepted": 3})
    outcome.partition_completed("b", {"accepted": 1})
    assert outcome.failure() is None
    assert outcome.results["a"] == {"accepted": 3, "status": "completed"}
    assert outcome.final_states() == {"a": "completed", "b": "completed"}
    assert not outcome.manifest_failure_is_consequence()


def test_failed_partitions_are_the_runs_reason_each_named():
    outcome = RunOutcome(["a", "b", "c"])
    outcome.started()
    outcome.partition_completed("a", {})
    outcome.partition_failed("b", "FAILED", "2 of 5 batches of partition b failed", "raw b")
    outcome.partition_failed("c", "CRASHED", "worker died", None)
    failure = outcome.failure()
    assert isinstance(failure, RunFailed)
    text = str(failure)
    assert text.startswith("2 of 3 partitions failed (b, c)")
    assert "2 of 5 batches of partition b failed" in text and "c: worker died" in text
    assert outcome.results["b"] == {"partition": "b", "status": "failed", "error": "raw b"}
    assert outcome.results["c"]["status"] == "crashed"
    assert outcome.final_states() == {"a": "completed", "b": "failed", "c": "crashed"}
    # A manifest that cannot be written after that is a consequence, not the reason.
    assert outcome.manifest_failure_is_consequence()


def test_the_stopping_fault_is_the_runs_one_reason_over_the_partitions_own():
    outcome = RunOutcome(["a", "b"])
    outcome.started()
    outcome.partition_failed("a", "FAILED", "server lost", None)
    outcome.partition_failed("b", "FAILED", "server lost", None)
    outcome.stopped_by(None)  # a supervisor with nothing to say changes nothing
    assert isinstance(outcome.failure(), RunFailed)
    outcome.stopped_by(ServerLost("server http://h:1 lost after 3 relaunches"))
    failure = outcome.failure()
    assert isinstance(failure, ServerLost)
    assert str(failure) == "server http://h:1 lost after 3 relaunches"


def test_a_stopping_fault_alone_makes_the_manifest_failure_a_consequence():
    outcome = RunOutcome(["a"])
    outcome.stopped_by(OutputWriteError("/out/p/part-00001.parquet: cannot write: No space left"))
    assert outcome.manifest_failure_is_consequence()


def test_a_stopped_run_marks_what_had_not_finished_and_keeps_own_reasons():
    outcome = RunOutcome(["a", "b", "c", "d"])
    outcome.started()
    outcome.partition_completed("a", {})
    outcome.partition_failed("b", "FAILED", "its own reason", None)
    outcome.stopped(KeyboardInterrupt())
    assert "a" not in outcome.errors
    assert outcome.errors["b"] == "its own reason"
    assert outcome.errors["c"] == outcome.errors["d"]
    assert "run stopped before it finished: KeyboardInterrupt" in outcome.errors["c"]
    # Still "running" in the live table: failed now, since the run holds a reason for them.
    assert outcome.final_states() == {"a": "completed", "b": "failed", "c": "failed", "d": "failed"}


def test_a_run_stopped_before_its_partitions_started_says_not_run():
    outcome = RunOutcome(["a", "b"])
    assert outcome.final_states() == {"a": "not run", "b": "not run"}
    outcome.stopped(RuntimeError("tokenizer missing"))
    assert outcome.final_states() == {"a": "not run", "b": "not run"}
    assert "tokenizer missing" in str(outcome.failure())


def test_summary_rows_follow_the_outcome(tmp_path: Path):
    outcome = RunOutcome(["a", "b", "c"])
    outcome.started()
    outcome.partition_completed("a", {})
    outcome.partition_failed("b", "FAILED", "bad batch", None)
    meter = RunMeter()
    meter.sizes.update({"a": 4, "b": 2, "c": 7})
    rows = outcome.summary_rows(str(tmp_path), meter, {"b": (1, "/artifacts/artifact/x")})
    assert [(r["partition"], r["status"]) for r in rows] == [
        ("a", "completed"),
        ("b", "failed"),
        ("c", "not run"),
    ]
    assert rows[1]["error"] == "[1 failed batch](/artifacts/artifact/x): bad batch"
    assert [r["input_lines"] for r in rows] == [4, 2, 7]


def test_each_partition_reads_its_end_as_soon_as_it_ends(tmp_path: Path):
    """The live table's state of a partition turns as its subflow ends, while the others run;
    one stopped reads cancelled everywhere, not failed."""
    outcome = RunOutcome(["short", "long", "images"])
    outcome.started()
    outcome.partition_completed("short", {})
    assert outcome.states == {"short": "completed", "long": "running", "images": "running"}
    outcome.partition_cancelled("long", "long: the run was stopped before this partition finished")
    outcome.stopped(RuntimeError("stopped"), cancelled=True)
    assert outcome.states["long"] == "cancelled"
    assert outcome.final_states() == {
        "short": "completed",
        "long": "cancelled",
        "images": "cancelled",
    }
    assert outcome.results["long"]["status"] == "cancelled"
    meter = RunMeter()
    meter.expect({"short": 64, "long": 24, "images": 8})
    rows = outcome.summary_rows(str(tmp_path), meter, {})
    assert [r["status"] for r in rows] == ["completed", "cancelled", "cancelled"]
