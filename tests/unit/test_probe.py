"""The throughput probe: the alarm's baseline is the run's own rate after the warm-up."""

from __future__ import annotations

from eagle3_datagen.config import ThroughputAlarm
from eagle3_datagen.report.probe import ThroughputProbe


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


def test_alarm_after_the_probe_fires_below_the_measured_rate() -> None:
    alarm = ThroughputAlarm(warmup_s=5, window_s=10, probe_s=20, alarm_ratio=0.5)
    probe = ThroughputProbe.from_config(alarm, start=0.0)
    assert probe is not None
    _feed(probe, {0: 1000}, until=25)
    watch = probe.watch(alarm, now=25.0)
    total = 25_000
    changes = []
    for s in range(26, 80):
        total += 1000 if s < 50 else 200  # the run falls to a fifth of its own rate
        change = watch.observe(float(s), total)
        if change is not None:
            changes.append(change)
    assert [c.kind for c in changes] == ["low"]
    assert changes[0].expected_tok_s == 1000.0 and changes[0].elapsed_s > 24


def test_no_probe_when_a_rate_is_configured_or_probing_is_off() -> None:
    assert ThroughputProbe.from_config(ThroughputAlarm(expected_tok_s=900), 0.0) is None
    assert ThroughputProbe.from_config(ThroughputAlarm(probe_s=0), 0.0) is None
    assert ThroughputProbe.from_config(ThroughputAlarm(), 0.0) is not None
