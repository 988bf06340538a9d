"""A partition's progress counts each input line once, whatever the retries."""

from __future__ import annotations

import re

from eagle3_datagen.report.progress import Progress
from eagle3_datagen.report.throughput import RunMeter
from eagle3_datagen.report.ui import run_progress_markdown, summary_row


def test_a_retried_batch_counts_its_lines_once() -> None:
    # 4 batches of 16 lines; batch 1 fails on its first attempt after 10 requests (7 kept in
    # the journal), then its retry settles the 7 and sends the other 9.
    p = Progress(total_lines=64, started=0.0)
    for index in (0, 2, 3):
        p.attempt(index)
        p.batch_started(index, 1)  # one input reject
        for _ in range(15):
            p.line_done(index, 100)
        p.batch_committed(
            index,
            lines=16,
            accepted=15,
            rejected=1,
            truncated=2,
            rejects_by_reason={"bad_input": 1},
        )
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
    p.batch_committed(1, lines=16, accepted=16, rejected=0, truncated=0, rejects_by_reason={})
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
