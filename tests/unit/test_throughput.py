"""The throughput alarm's rate window and its ok -> low -> ok state machine."""

from __future__ import annotations

import pytest

from eagle3_datagen.config import ThroughputAlarm
from eagle3_datagen.report.progress import Progress
from eagle3_datagen.report.throughput import (
    RateWindow,
    RunMeter,
    ThroughputWatch,
    sample_interval,
)


def test_rate_window_needs_the_whole_window_then_averages_over_it() -> None:
    w = RateWindow(window_s=30)
    w.add(0, 0)
    w.add(10, 1000)
    w.add(20, 2000)
    assert w.rate() is None  # only 20 s of samples
    w.add(30, 3000)
    assert w.rate() == pytest.approx(100.0)
    # A slowdown shows within one window and the old fast samples drop out.
    for t in (40, 50, 60):
        w.add(t, 3000 + (t - 30) * 10)
    assert w.rate() == pytest.approx(10.0)


def watch(**kw: float) -> ThroughputWatch:
    args = {"expected_tok_s": 1000.0, "alarm_ratio": 0.5, "warmup_s": 60.0, "window_s": 20.0}
    args.update(kw)
    return ThroughputWatch(start=0.0, **args)


def feed(w: ThroughputWatch, rates: list[tuple[float, float]], every: float = 5.0) -> list:
    """Feed constant rates (until_t, tok/s) sampled every ``every`` s; return the changes."""
    t, total, changes = 0.0, 0.0, []
    w.observe(t, 0)
    for until, rate in rates:
        while t < until:
            t += every
            total += rate * every
            change = w.observe(t, int(total))
            if change is not None:
                changes.append((t, change))
    return changes


def test_no_alarm_during_warm_up_even_when_slow() -> None:
    assert feed(watch(), [(55, 10.0)]) == []  # warm-up ends at 60 s


def test_one_alarm_per_dip_and_one_recovery() -> None:
    w = watch()
    changes = feed(w, [(100, 1000.0), (200, 225.0), (300, 1000.0), (400, 225.0)])
    kinds = [c.kind for _, c in changes]
    assert kinds == ["low", "recovered", "low"]  # not one per sample
    t_low, low = changes[0]
    assert 100 < t_low <= 120  # within one window of the slowdown
    assert low.rate_tok_s < 500 and low.expected_tok_s == 1000 and low.threshold_tok_s == 500
    t_back, back = changes[1]
    assert back.dip_s == pytest.approx(t_back - t_low)
    assert back.lowest_tok_s == pytest.approx(225.0)


def test_the_seed_shortfall_is_reported_by_how_much() -> None:
    _, low = feed(watch(warmup_s=0), [(60, 225.0)])[0]
    assert low.shortfall == pytest.approx(0.775)
    assert "78% below the expected 1000 tok/s" in low.summary()
    payload = low.payload()
    assert payload["rate_tok_s"] == 225.0 and payload["shortfall_pct"] == 77.5
    assert payload["kind"] == "low" and payload["window_s"] == 20.0


def test_a_rate_hovering_at_the_threshold_does_not_flap() -> None:
    w = watch(warmup_s=0)
    changes = feed(w, [(40, 450.0), (80, 520.0), (120, 460.0), (160, 530.0)])
    assert [c.kind for _, c in changes] == ["low"]
    assert w.state == "low"


def test_off_without_expected_rate_and_sampling_fits_the_window() -> None:
    assert ThroughputWatch.from_config(ThroughputAlarm(), 0.0) is None
    w = ThroughputWatch.from_config(ThroughputAlarm(expected_tok_s=930), 0.0)
    assert w is not None and w.threshold_tok_s == 465 and w.warmup_s == 300
    assert sample_interval(120) == 10.0 and sample_interval(2) == 0.5


def test_run_meter_sums_partitions_and_rates_each_by_its_own_progress() -> None:
    meter = RunMeter()
    meter.expect({"a": 100, "b": 50})
    a, b = Progress(started=0.0), Progress(started=0.0)
    meter.track("a", a)
    meter.track("b", b)
    assert (a.total_lines, b.total_lines) == (100, 50)  # the sizes found before the server
    a.batch_started(0, 10)
    a.line_done(0, 500)
    b.batch_started(0, 0)
    b.line_done(0, 300)
    assert meter.total_tokens() == 800
    assert meter.totals() == (12, 150)
    a.finished = 20.0
    wall, tok_s = meter.timing("a") or (0, 0)
    assert (wall, tok_s) == (20.0, 25.0) and tok_s == a.tok_s()  # one definition of tok/s
    assert meter.timing("missing") is None
