"""What the Prefect UI shows: summary rows, failure messages, alarm text."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

from eagle3_datagen.errors import BatchFailed, BatchTaskFailed, InputFileError
from eagle3_datagen.report.progress import Progress
from eagle3_datagen.report.throughput import RunMeter, ThroughputChange
from eagle3_datagen.report.ui import (
    batch_failure_message,
    eval_description,
    eval_markdown,
    failed_batch_row,
    format_duration,
    progress_percent,
    run_failed_batch_row,
    run_failure_message,
    run_name,
    run_progress_markdown,
    summary_description,
    summary_row,
    throughput_markdown,
)
from eagle3_datagen_flows.prefect_text import artifact_key, failure_reason


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
    # The parent's own message as `eagle3-datagen failures` shows it: no class-name preamble.
    assert (
        failure_reason(
            "Flow run encountered an exception: RunFailed: 1 of 2 partitions failed (p1): x", "F"
        )
        == "1 of 2 partitions failed (p1): x"
    )
    assert failure_reason("ServerLost: server http://h:1 lost", "F") == "server http://h:1 lost"


def test_summary_rows_carry_this_runs_counts_and_what_is_on_disk_separately() -> None:
    this_run = {
        "input_lines": 63,
        "accepted": 55,
        "rejected": 8,
        "truncated": 11,
        "truncation_rate": 0.2,
        "output_tokens": 9300,
        "rejects_by_reason": {"duplicate_id": 5, "bad_input": 3},
        "wall_s": 75.0,
        "output_tok_s": 124.0,
    }
    on_disk = {"input_lines": 63, "accepted": 55, "rejected": 8}
    row = summary_row("demo_short", "completed", this_run, input_lines=63, on_disk=on_disk)
    assert row == {
        "partition": "demo_short",
        "status": "completed",
        "input_lines": 63,
        "accepted": 55,
        "rejected": 8,
        "rejected_by_reason": "bad_input=3, duplicate_id=5",
        "truncation_rate": "20.0%",
        "output_tokens": 9300,
        "tok_per_s": 124,
        "wall_time": "1m15s",
        "on_disk": "63 of 63 lines: 55 accepted, 8 rejected",
        "error": "",
    }
    # A partition that failed before generating: the partition's size, zeros for this run, and
    # an earlier run's data named as what is on disk, not as this run's numbers.
    failed = summary_row(
        "p2",
        "failed",
        None,
        input_lines=24,
        error="input file not found",
        on_disk={"input_lines": 24, "accepted": 24, "rejected": 0},
    )
    assert (failed["input_lines"], failed["accepted"], failed["output_tokens"]) == (24, 0, 0)
    assert failed["on_disk"] == "24 of 24 lines: 24 accepted, 0 rejected"
    assert failed["wall_time"] == "-" and failed["error"] == "input file not found"
    linked = summary_row(
        "p3",
        "failed",
        None,
        input_lines=64,
        error="2 of 4 batches failed",
        failed_batches=(2, "http://ui/artifacts/artifact/abc"),
    )
    assert linked["error"] == (
        "[2 failed batches](http://ui/artifacts/artifact/abc): 2 of 4 batches failed"
    )
    desc = summary_description([row, failed], "/out")
    assert desc == "2 partitions, 55 records accepted in this run, output /out; FAILED: p2"


def test_failed_batch_rows_name_lines_cause_and_attempts() -> None:
    err = BatchTaskFailed("generate[demo_short/0002]: line 40: request failed after 2 attempts")
    row = failed_batch_row("demo_short/0002", 33, 16, err, 2)
    # In column order: what an operator decides on first, then which lines.
    assert list(row.items()) == [
        ("status", "failed"),
        ("cause", "line 40: request failed after 2 attempts"),
        ("attempts", 2),
        ("batch", "demo_short/0002"),
        ("first_line", 33),
        ("last_line", 48),
    ]
    # The parent's table: the partition (a link) after them, the batch by its number alone.
    parent = run_failed_batch_row("[demo_short](http://ui/a/1)", row)
    assert list(parent) == [
        "status",
        "cause",
        "attempts",
        "partition",
        "batch",
        "first_line",
        "last_line",
    ]
    assert parent["partition"] == "[demo_short](http://ui/a/1)" and parent["batch"] == "0002"
    long = failed_batch_row("p/0001", 1, 16, BatchTaskFailed("x" * 1000), 1)
    assert len(long["cause"]) == 300 and long["cause"].endswith("…")
    assert failed_batch_row("p/0001", 1, 16, asyncio.CancelledError(), 1)["status"] == "cancelled"


def test_run_names_say_what_ran() -> None:
    when = datetime(2026, 11, 29, 2, 0, tzinfo=UTC)
    config = {"output_dir": "/data/eagle3/kimi", "partitions": [{"name": "a"}, {"name": "b"}]}
    assert run_name("kimi-k2.5", config, None, when) == "kimi-k2.5: a+b 2026-11-29 02:00Z"
    assert run_name(None, config, ["b"], when) == "kimi: b 2026-11-29 02:00Z"
    many = [f"p{i}" for i in range(5)]
    assert run_name("d", config, many, when).startswith("d: p0+p1+p2+2 more ")


def test_the_parents_table_has_every_partition_before_and_while_it_runs() -> None:
    meter = RunMeter()
    meter.expect({"a": 64, "b": 24})
    a = Progress(started=0.0)
    meter.track("a", a)
    a.batch_started(0, 0)
    for _ in range(16):
        a.line_done(0, 10)
    a.finished = 8.0
    table = run_progress_markdown(meter, {"a": "running"})
    assert "| a | running | 16/64 | 25% | 20 | 0 | 0.4m |" in table
    assert "| b | waiting | 0/24 | 0% | - | - | - |" in table
    # The batch fails: its settled lines are not on disk, and a failed partition has no ETA.
    a.batch_failed(0)
    table = run_progress_markdown(meter, {"a": "failed"})
    assert "| a | failed | 0/64 | 0% | 20 | 0 | - |" in table


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


def test_a_cancelled_run_reads_as_cancelled_not_as_a_signal_number(tmp_path) -> None:
    from eagle3_datagen.report.ui import stopped_reason, summary_rows

    errors = {
        "a": stopped_reason(RuntimeError("15"), cancelled=True),
        "b": stopped_reason(RuntimeError("disk full")),
    }
    rows = summary_rows(str(tmp_path), ["a", "b", "c"], {"c"}, errors, RunMeter())
    assert [r["status"] for r in rows] == ["cancelled", "failed", "completed"]
    assert "15" not in rows[0]["error"] and rows[0]["error"].startswith("cancelled: ")
    assert len(rows[0]["error"]) <= 40  # the summary's error column fits at 1400 px
    assert summary_description(rows, "/out").endswith("; CANCELLED: a; FAILED: b")


def test_eval_artifact_leads_with_the_verdict_and_wraps_its_result() -> None:
    """Its verdict is the first line; the result is a list (a code block's long lines run
    off-screen at 1400 px), slices nested, names shown as written; the emulator is said."""
    lines = [
        "eval of 7 held-out records (7 conversations; ...) on http://127.0.0.1:1, split ab",
        "accept length 2.374 [2.125, 2.5192] (tokens per verify step; ...)",
        "  by partition: demo_short: 2.374 (7)",
        "  by output_length: <128: 2.2614 (6)",
        "gate passed: no baseline to compare with",
    ]
    table = ["eval started (UTC)  draft  gate", "2026-12-05 01:52    /d     passed"]
    text = eval_markdown(lines[-1], lines, table, "/data/x", emulated=True).splitlines()
    assert text[0] == "**gate passed: no baseline to compare with**"
    assert "EMULATED: the bundled SGLang emulator answered" in text[2]
    assert "- accept length 2.374 \\[2.125, 2.5192\\] (tokens per verify step; ...)" in text
    assert "    - by partition: demo\\_short: 2.374 (7)" in text
    assert "    - by output\\_length: \\<128: 2.2614 (6)" in text
    assert text[-2:] == [f"    {row}" for row in table]  # the narrow table stays aligned
    assert not any(line.startswith("    eval of") for line in text)
    verdict = "gate failed: accept length dropped"
    assert eval_description(verdict, emulated=False) == verdict
    assert eval_description(verdict, emulated=True).startswith(f"{verdict}; EMULATED: ")
