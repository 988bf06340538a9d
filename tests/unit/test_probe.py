"""The throughput probe: the alarm's baseline is the run's own rate after the warm-up."""

from __future__ import annotations

from eagle3_datagen.config import ThroughputAlarm
from eagle3_datagen.report.probe import Baseline, ThroughputProbe
from eagle3_datagen.report.throughput import ThroughputChange, ThroughputMonitor


def _feed(probe: ThroughputProbe, rate_at: dict[int, float], until: int) -> list[tuple[int, float]]:
    """One sample a second; the rate of second ``s`` is the latest ``rate_at`` key <= s."""
    found, total, rate = [], 0.0, 0.0
    for s in range(until + 1):
        rate = rate_at.get(s, rate)
        baseline = probe.observe(float(s), int(total))
        if baseline is not None:
            found.append((s, baseline.tok_s))
        total += rate
    return found


def test_baseline_is_the_rate_after_the_warmup_not_the_ramp() -> None:
    probe = ThroughputProbe(warmup_s=10, probe_s=20, start=0.0)
    # Ramp at 100 tok/s during the warm-up, then 1,000 tok/s.
    found = _feed(probe, {0: 100, 10: 1000}, until=60)
    assert found == [(30, 1000.0)]  # once, when the window closes
    assert probe.baseline is not None and probe.baseline.window_s == 20
    assert "1000 output tok/s" in probe.baseline.summary()


def test_a_window_without_tokens_measures_nothing_and_starts_again() -> None:
    probe = ThroughputProbe(warmup_s=0, probe_s=10, start=0.0)
    found = _feed(probe, {0: 0, 10: 500}, until=40)
    assert found == [(20, 500.0)]


def test_the_monitor_probes_then_fires_below_the_measured_rate() -> None:
    alarm = ThroughputAlarm(warmup_s=5, window_s=10, probe_s=20, alarm_ratio=0.5)
    monitor = ThroughputMonitor.from_config(alarm, start=0.0)
    assert monitor is not None
    happened: list[tuple[int, object]] = []
    total = 0
    for s in range(1, 80):
        total += 1000 if s < 50 else 200  # the run falls to a fifth of its own rate
        seen = monitor.observe(float(s), total)
        if seen is not None:
            happened.append((s, seen))
    [(when, baseline), (_, change)] = happened
    assert isinstance(baseline, Baseline) and baseline.tok_s == 1000.0 and when == 25
    assert isinstance(change, ThroughputChange) and change.kind == "low"
    assert change.expected_tok_s == 1000.0 and change.elapsed_s > 24


def test_a_configured_rate_is_watched_from_the_start_without_a_probe() -> None:
    monitor = ThroughputMonitor.from_config(
        ThroughputAlarm(expected_tok_s=1000, warmup_s=0, window_s=10, alarm_ratio=0.5), 0.0
    )
    assert monitor is not None and monitor.probe is None
    seen = [monitor.observe(float(s), 100 * s) for s in range(20)]
    changes = [c for c in seen if c is not None]
    assert len(changes) == 1 and isinstance(changes[0], ThroughputChange)
    assert changes[0].kind == "low" and changes[0].expected_tok_s == 1000
    assert ThroughputMonitor.from_config(ThroughputAlarm(probe_s=0), 0.0) is None


def test_no_probe_when_a_rate_is_configured_or_probing_is_off() -> None:
    assert ThroughputProbe.from_config(ThroughputAlarm(expected_tok_s=900), 0.0) is None
    assert ThroughputProbe.from_config(ThroughputAlarm(probe_s=0), 0.0) is None
    assert ThroughputProbe.from_config(ThroughputAlarm(), 0.0) is not None
