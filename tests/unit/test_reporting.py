"""What the Prefect UI shows: summary rows, failure messages, alarm text."""

from __future__ import annotations

from eagle3_datagen.errors import BatchFailed, InputFileError
from eagle3_datagen.report.throughput import ThroughputChange
from eagle3_datagen.report.ui import (
    artifact_key,
    batch_failure_message,
    failure_reason,
    format_duration,
    progress_percent,
    run_failure_message,
    summary_description,
    summary_row,
    throughput_markdown,
)


def test_a_failed_batch_names_partition_batch_and_cause() -> None:
    err = BatchFailed("partition demo_short, line 17: request failed after 4 attempts: refused")
    assert batch_failure_message("demo_short/0002", "demo_short", err) == (
        "generate[demo_short/0002]: line 17: request failed after 4 attempts: refused"
    )
    assert batch_failure_message("p/0000", "p", KeyError("x")) == "generate[p/0000]: KeyError: 'x'"
    assert batch_failure_message("p/0000", "p", TimeoutError()) == "generate[p/0000]: TimeoutError"
    assert batch_failure_message("p/0001", "p", InputFileError("/x.jsonl: gone")) == (
        "generate[p/0001]: /x.jsonl: gone"
    )


def test_the_parent_message_names_the_failed_partitions() -> None:
    reason = failure_reason(
        "Flow run encountered an exception: PartitionFailed: 4 of 4 batches of partition "
        "demo_short failed; first: generate[demo_short/0000]: HTTP 500",
        "FAILED",
    )
    assert reason.startswith("4 of 4 batches of partition demo_short failed")
    msg = run_failure_message({"demo_short": reason, "demo_long": "input missing"}, 2)
    assert msg.startswith("2 of 2 partitions failed (demo_short, demo_long): 4 of 4")
    assert "; demo_long: input missing" in msg
    assert failure_reason(None, "CRASHED") == "CRASHED"


def test_summary_rows_carry_counts_reasons_truncation_rate_and_speed() -> None:
    summary = {"input_lines": 63, "accepted": 55, "rejected": 8, "truncated": 11,
               "truncation_rate": 0.2, "output_tokens": 9300,
               "rejects_by_reason": {"duplicate_id": 5, "bad_input": 3},
               "wall_s": 75.0, "output_tok_s": 124.0}  # fmt: skip
    row = summary_row("demo_short", "completed", summary)
    assert row == {
        "partition": "demo_short", "status": "completed", "input_lines": 63, "accepted": 55,
        "rejected": 8, "rejected_by_reason": "bad_input=3, duplicate_id=5",
        "truncation_rate": "20.0%", "output_tokens": 9300, "tok_per_s": 124,
        "wall_time": "1m15s", "error": "",
    }  # fmt: skip
    failed = summary_row("p2", "failed", None, timing=(3.5, 0.0), error="boom")
    assert failed["accepted"] == 0 and failed["wall_time"] == "3.5s" and failed["error"] == "boom"
    desc = summary_description([row, failed], "/out")
    assert desc == "2 partitions, 55 records accepted, output /out; FAILED: p2"


def test_small_formats() -> None:
    assert artifact_key("progress", "B1_glaive.v2") == "progress-b1-glaive-v2"
    assert format_duration(None) == "-" and format_duration(7322) == "2h02m"
    assert progress_percent(5, 0) == 0.0 and progress_percent(7, 5) == 100.0


def test_alarm_markdown_says_by_how_much() -> None:
    low = ThroughputChange("low", 225.0, 930.0, 465.0, 120.0, elapsed_s=900.0)
    text = throughput_markdown(low, "nightly-run")
    assert "# Throughput low: nightly-run" in text and "**76% below expected**" in text
    assert "| expected | 930 |" in text and "| alarm threshold | 465 |" in text
    back = ThroughputChange("recovered", 990.0, 930.0, 465.0, 120.0, 1500.0, 600.0, 210.0)
    assert "recovered to 990 tok/s" in throughput_markdown(back, "r")
