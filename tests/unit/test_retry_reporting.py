"""What a retried run and its failures say, without Prefect's server: a partition an earlier
attempt completed reads ``reused``, the summary leads with status, on_disk and error, a
superseded table says by whom, subflows inherit no other partition's tag, and an expected
failure's traceback leaves Prefect's ERROR log lines (a bug keeps its traceback)."""

from __future__ import annotations

import io
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from eagle3_datagen.errors import (
    BatchTaskFailed,
    PartitionFailed,
    RetriesExhaustedError,
    RunFailed,
    is_expected,
)
from eagle3_datagen.report.outcome import RunOutcome
from eagle3_datagen.report.throughput import RunMeter
from eagle3_datagen.report.ui import attempt_line, run_progress_markdown, superseded_description
from eagle3_datagen_flows.attempts import shared_tags
from eagle3_datagen_flows.expected_failures import FLOW_RUNS, TASK_RUNS, install

# Prefect's API log handler, outside a flow run, warns that it has nowhere to send the lines.
pytestmark = pytest.mark.filterwarnings("ignore:Logger 'prefect.:UserWarning")


def test_a_reused_partition_completes_and_says_reused(tmp_path: Path) -> None:
    outcome = RunOutcome(["short", "long"])
    outcome.partition_reused("short", {"input_lines": 64, "accepted": 60})
    outcome.started()
    assert outcome.states == {"short": "reused", "long": "running"}
    outcome.partition_completed("long", {"accepted": 24})
    assert outcome.failure() is None
    assert outcome.results["short"]["status"] == "completed"  # the manifest: it is complete
    assert outcome.final_states() == {"short": "reused", "long": "completed"}
    rows = outcome.summary_rows(str(tmp_path), RunMeter(), {})
    assert [r["status"] for r in rows] == ["reused", "completed"]


def test_the_summary_leads_with_status_on_disk_and_error(tmp_path: Path) -> None:
    outcome = RunOutcome(["a"])
    outcome.started()
    outcome.partition_failed("a", "FAILED", "2 of 4 batches of partition a failed", None)
    [row] = outcome.summary_rows(str(tmp_path), RunMeter(), {})
    assert list(row)[:4] == ["partition", "status", "on_disk", "error"]
    assert (row["status"], row["on_disk"]) == ("failed", "nothing")
    assert row["error"] == "2 of 4 batches of partition a failed"


def test_a_superseded_table_says_by_whom_and_what_it_said() -> None:
    text = superseded_description("run 'nightly' (attempt 3)", "demo_long: 2 of 2 batches failed")
    assert text == (
        "Superseded by run 'nightly' (attempt 3): all batches committed; "
        "was: demo_long: 2 of 2 batches failed"
    )
    assert attempt_line(1) == "attempt 1 of this run"
    assert attempt_line(3).startswith("attempt 3 of this run (a retry)")


def test_subflows_inherit_no_partition_or_tier_tag() -> None:
    retried_parent = ["demo", "eagle3-datagen", "partition:demo_long", "partition:demo_short"]
    assert shared_tags([*retried_parent, "tier:SHORT", "nightly"]) == [
        "demo",
        "eagle3-datagen",
        "nightly",
    ]


def _raised(err: BaseException, cause: BaseException | None = None) -> BaseException:
    try:
        try:
            raise cause or err
        except BaseException as inner:
            if cause is None:
                raise
            raise err from inner
    except BaseException as caught:
        return caught


def test_what_is_expected() -> None:
    out_of_tries = RetriesExhaustedError("request failed after 2 attempts: HTTP 500")
    assert is_expected(_raised(BatchTaskFailed("generate[a/0001]: line 17: ..."), out_of_tries))
    assert is_expected(PartitionFailed("1 of 4 batches of partition a failed"))
    assert is_expected(RunFailed("1 of 3 partitions failed"))
    # A bug inside a batch stays a bug, wrapper or not.
    assert not is_expected(
        _raised(BatchTaskFailed("generate[a/0001]: KeyError: 'x'"), KeyError("x"))
    )
    assert not is_expected(KeyError("x"))


@pytest.fixture
def captured() -> Iterator[io.StringIO]:
    """Prefect's two run loggers, with the filter installed, written to one stream."""
    install()
    install()  # once per process, however often the flows are imported
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s %(message)s"))
    loggers = [logging.getLogger(TASK_RUNS), logging.getLogger(FLOW_RUNS)]
    assert all(
        sum(type(f).__name__ == "ExpectedFailures" for f in lg.filters) == 1 for lg in loggers
    )
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.addHandler(handler)
        lg.setLevel(logging.INFO)
    yield stream
    for lg, level in zip(loggers, levels, strict=True):
        lg.removeHandler(handler)
        lg.setLevel(level)


def _log_failure(logger: str, err: BaseException, message: str, task_run: str) -> None:
    """``message`` at ERROR with the traceback of ``err``, as Prefect's engines log it."""
    try:
        raise err
    except BaseException:
        logging.getLogger(logger).error(message, exc_info=True, extra=_run(task_run))


def _run(task_run: str) -> dict[str, str | None]:
    """What Prefect's task-run logger adds to each record (none here, outside a flow run)."""
    return {"task_run_id": task_run, "flow_run_id": None}


def _batch_out_of_tries() -> BaseException:
    cause = RetriesExhaustedError("request failed after 2 attempts: HTTP 500")
    return _raised(BatchTaskFailed("generate[a/0001]: line 17: request failed"), cause)


def test_an_expected_batch_failure_is_one_error_line(captured: io.StringIO) -> None:
    _log_failure(TASK_RUNS, _batch_out_of_tries(), "Task run failed - Retries are exhausted", "t1")
    finished = "Finished in state Failed('generate[a/0001]: line 17: request failed')"
    logging.getLogger(TASK_RUNS).error(finished, extra=_run("t1"))
    _log_failure(FLOW_RUNS, PartitionFailed("1 of 4 failed"), "Encountered exception", "")
    lines = captured.getvalue().splitlines()
    assert lines == [
        "ERROR prefect.task_runs Task run failed - Retries are exhausted",
        f"INFO prefect.task_runs {finished}",
        "ERROR prefect.flow_runs Encountered exception",
    ]


def test_an_expected_failures_traceback_goes_to_debug(captured: io.StringIO) -> None:
    logging.getLogger(TASK_RUNS).setLevel(logging.DEBUG)
    _log_failure(TASK_RUNS, _batch_out_of_tries(), "Task run failed - Retries are exhausted", "t2")
    logging.getLogger(TASK_RUNS).error("Finished in state Failed('...')", extra=_run("t2"))
    text = captured.getvalue()
    debug, error = text.split("\nERROR ")
    assert debug.startswith("DEBUG prefect.task_runs the traceback of the failure below")
    assert "Traceback" in debug and "RetriesExhaustedError" in debug
    assert error == (
        "prefect.task_runs Task run failed - Retries are exhausted\n"
        "INFO prefect.task_runs Finished in state Failed('...')\n"
    )


def test_a_bug_keeps_its_traceback_at_error(captured: io.StringIO) -> None:
    bug = _raised(BatchTaskFailed("generate[a/0001]: KeyError: 'x'"), KeyError("x"))
    _log_failure(TASK_RUNS, bug, "Task run failed with exception - Retries are exhausted", "t3")
    logging.getLogger(TASK_RUNS).error("Finished in state Failed('...')", extra=_run("t3"))
    text = captured.getvalue()
    assert text.startswith("ERROR prefect.task_runs Task run failed") and "Traceback" in text
    assert "ERROR prefect.task_runs Finished in state Failed" in text


def test_a_reused_partition_counts_as_done_in_the_parents_progress() -> None:
    meter = RunMeter()
    meter.expect({"short": 64, "long": 24})
    meter.reused("short", 64)
    assert meter.totals() == (64, 88)  # not 0 of 88: the run's percent does not go back
    table = run_progress_markdown(meter, {"short": "reused", "long": "running"})
    assert "| short | reused | 64/64 | 100% | 0 | 0 | - |" in table, table
