"""A partition's progress counts each input line once, whatever the retries."""

from __future__ import annotations

import re

from eagle3_datagen.report.progress import Progress
from eagle3_datagen.report.throughput import RunMeter
from eagle3_datagen.report.ui import run_progress_markdown, summary_row
from eagle3_datagen.write.shards import BatchSummary


def test_a_retried_batch_counts_its_lines_once() -> None:
    # 4 batches of 16 lines; batch 1 fails on its first attempt after 10 requests (7 kept in
    # the journal), then its retry settles the 7 and sends the other 9.
    p = Progress(total_lines=64, started=0.0)
    for index in (0, 2, 3):
        p.attempt(index)
        p.batch_started(index, 1)  # one input reject
        for _ in range(15):
            p.line_done(index, 100)
        p.batch_committed(BatchSummary("p", index, 0, 16, 15, 1, 2, {"bad_input": 1}))
    p.attempt(1)
    p.batch_started(1, 0)
    for _ in range(10):
        p.line_done(1, 100)
    for _ in range(3):
        p.retry()
    assert p.done == 58
    p.attempt(1)
    p.batch_started(1, 7)  # the retry: the journaled 7 are settled, 9 to send
    assert p.done == 55  # the 3 lost in flight are not done any more
    for _ in range(9):
        p.line_done(1, 100)
    p.batch_committed(BatchSummary("p", 1, 0, 16, accepted=16))
    assert p.done == 64 == p.total_lines  # never 83/64
    assert p.attempts == {0: 1, 2: 1, 3: 1, 1: 2}
    assert p.output_tokens == 45 * 100 + 19 * 100  # each response once
    run = p.this_run()
    assert (run["input_lines"], run["accepted"], run["rejected"]) == (64, 61, 3)
    assert run["rejects_by_reason"] == {"bad_input": 3}


def test_skipped_batches_are_done_but_not_this_runs_work() -> None:
    p = Progress(total_lines=32, started=0.0)
    p.batch_skipped(16)
    assert p.done == 16 and p.this_run()["accepted"] == 0
    p.finished = 10.0
    assert p.lines_per_s() == 0.0 and p.eta() == "?"


def test_progress_line_and_one_rate() -> None:
    p = Progress(total_lines=100, started=0.0)
    p.batch_started(0, 0)
    for _ in range(40):
        p.line_done(0, 250)
    p.retry()
    p.finished = 20.0
    line = p.line()
    assert re.fullmatch(r"40/100 \(1 err\) 2\.0 req/s avg_comp=250tok 500 tok/s ETA=0\.5m", line)
    assert p.tok_s() == 500.0 == p.this_run()["output_tok_s"]


def test_the_summary_row_and_the_progress_line_show_one_rate() -> None:
    """319.46 tok/s: rounded directly it is 319, through the manifest's 319.5 it is 320; the
    progress line, the parent's table and the summary row all show the same whole number."""
    p = Progress(total_lines=10, started=0.0)
    p.batch_started(0, 0)
    for _ in range(10):
        p.line_done(0, 31946)
    p.finished = 1000.0
    shown = int(re.findall(r"(\d+) tok/s", p.line())[0])
    row = summary_row("p", "completed", p.this_run(), input_lines=10)
    meter = RunMeter()
    meter.expect({"p": 10})
    meter.track("p", p)
    table_line = run_progress_markdown(meter, {"p": "completed"}).splitlines()[-1]
    assert shown == row["tok_per_s"] == int(table_line.split("|")[5]) == 320


class FakeClock:
    """Monotonic seconds that move only when the test says so (Progress's ``clock``)."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_the_eta_stops_being_a_number_while_the_last_requests_time_out_and_retry() -> None:
    clock = FakeClock()
    p = Progress(total_lines=64, clock=clock)
    meter = RunMeter()
    meter.expect({"p": 64})
    meter.track("p", p)
    p.batch_started(0, 0)
    for _ in range(62):  # 62 lines in 5 minutes, evenly
        clock.now += 300 / 62
        p.line_done(0, 100)
    assert p.eta() == "0.2m"  # 2 lines left at 62 per 300 s: about 10 s
    clock.now += 5
    assert p.eta() == "0.2m"  # still within what the rate said was left
    # Past it with nothing finished: the rate no longer describes the run.
    clock.now += 15
    assert p.eta() == "? (no line finished for 20s)"
    # The two requests time out (120 s) and are retried, again and again.
    for _ in range(3):
        clock.now += 120
        p.retry()
        p.retry()
    clock.now += 40
    assert p.eta() == "? (no line finished for 7.0m; 6 retries since)"
    assert p.line().endswith("(6 err) 0.1 req/s avg_comp=100tok 9 tok/s ETA=" + p.eta())
    table = run_progress_markdown(meter, {"p": "running"})
    assert (
        "| p | running | 62/64 | 97% | 9 | 6 | ? (no line finished for 7.0m; 6 retries since) |"
        in table
    )
    # One of them finally answers: a number again, at the rate the whole run has made.
    p.line_done(0, 100)
    assert p.eta() == f"{1 / (63 / clock.now) / 60:.1f}m" == "0.2m"


def test_a_retry_in_a_flowing_run_leaves_the_eta_a_number() -> None:
    clock = FakeClock()
    p = Progress(total_lines=1000, clock=clock)
    p.batch_started(0, 0)
    for _ in range(100):  # a line every second
        clock.now += 1.0
        p.line_done(0, 100)
    p.retry()  # one 503, retried while other requests keep finishing
    clock.now += 0.5
    assert p.eta() == "15.1m"  # 900 lines at 100 per 100.5 s
    clock.now += 0.6  # a gap longer than average happens
    assert p.eta() == "15.2m"  # 900 lines at 100 per 101.1 s
    clock.now += 2.0  # three average gaps without a line, with a retry pending: stalling
    assert p.eta() == "? (no line finished for 3s; 1 retry since)"
    p.line_done(0, 100)
    assert p.eta() == "15.3m"  # 899 lines at 101 per 103.1 s


def test_retries_before_any_line_say_so() -> None:
    clock = FakeClock()
    p = Progress(total_lines=10, clock=clock)
    clock.now = 30.0
    assert p.eta() == "?"
    p.retry()
    assert p.eta() == "? (no line finished for 30s; 1 retry since)"
    p.finish()
    clock.now = 90.0  # a finished partition's clock has stopped
    assert p.elapsed() == 30.0


def test_a_partition_that_ended_with_lines_left_keeps_no_eta() -> None:
    """Failed or cancelled: its own progress line (the subflow's artifact) says how many lines
    are left, not when they will be done; a completed one says 0.0m."""
    clock = FakeClock()
    p = Progress(total_lines=64, clock=clock)
    p.batch_started(0, 0)
    for _ in range(24):
        clock.now += 1.0
        p.line_done(0, 100)
    assert p.eta() == "0.7m"
    p.end()
    clock.now += 600
    assert p.eta() == "- (ended with 40 lines left)"
    assert p.line().endswith("ETA=- (ended with 40 lines left)")
    done = Progress(total_lines=1, clock=clock)
    done.batch_started(0, 0)
    done.line_done(0, 100)
    done.end()
    assert done.eta() == "0.0m"
