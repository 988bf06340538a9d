"""Is the run making the output tokens per second it should? A windowed rate and an ok/low alarm.

The seed's run made 225 output tok/s for hours where 930-1350 were expected, and nobody noticed.
The parent flow samples the run's output-token count every few seconds; :class:`ThroughputWatch`
turns the samples into a rate over a trailing window and reports a transition when the run goes
low (once per dip, not at every sample) and when it recovers. No Prefect here: the flow turns a
transition into a warning, an event and an artifact.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any, Literal

from eagle3_datagen.config import ThroughputAlarm
from eagle3_datagen.report.probe import Baseline, ThroughputProbe
from eagle3_datagen.report.progress import Progress

# A dip ends only above threshold x this, so a rate hovering at the line does not flap.
RECOVERY_MARGIN = 1.1
# How often the flow samples: often enough for a short window, at most every 10 s.
MAX_SAMPLE_EVERY_S = 10.0


def sample_interval(window_s: float) -> float:
    """Seconds between samples: a quarter of the window, capped at 10 s."""
    return max(0.2, min(MAX_SAMPLE_EVERY_S, window_s / 4))


class RateWindow:
    """Output tokens per second over the last ``window_s`` seconds of cumulative samples."""

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self._samples: deque[tuple[float, int]] = deque()

    def add(self, t: float, total_tokens: int) -> None:
        self._samples.append((t, total_tokens))
        # Keep one sample at or before the window's start as the anchor; drop older ones.
        while len(self._samples) >= 2 and self._samples[1][0] <= t - self.window_s:
            self._samples.popleft()

    def rate(self) -> float | None:
        """The rate over the window, or None until samples span the whole window."""
        if len(self._samples) < 2:
            return None
        (t0, n0), (t1, n1) = self._samples[0], self._samples[-1]
        if t1 - t0 < self.window_s:
            return None
        return (n1 - n0) / (t1 - t0)


@dataclass(frozen=True, slots=True)
class ThroughputChange:
    """A transition of the alarm: the run went ``low``, or ``recovered`` from a dip."""

    kind: Literal["low", "recovered"]
    rate_tok_s: float
    expected_tok_s: float
    threshold_tok_s: float
    window_s: float
    elapsed_s: float  # since generation started
    dip_s: float = 0.0  # recovered: how long the dip lasted
    lowest_tok_s: float | None = None  # recovered: the lowest windowed rate of the dip

    @property
    def shortfall(self) -> float:
        """How far below the expected rate, as a fraction (0.76 = 76% below)."""
        return max(0.0, 1.0 - self.rate_tok_s / self.expected_tok_s)

    def summary(self) -> str:
        """One line for the log and the notification."""
        if self.kind == "low":
            return (
                f"output throughput {self.rate_tok_s:.0f} tok/s over the last "
                f"{self.window_s:.0f} s is {self.shortfall:.0%} below the expected "
                f"{self.expected_tok_s:.0f} tok/s (alarm below {self.threshold_tok_s:.0f} tok/s)"
            )
        lowest = f", lowest {self.lowest_tok_s:.0f} tok/s" if self.lowest_tok_s is not None else ""
        return (
            f"output throughput recovered to {self.rate_tok_s:.0f} tok/s (expected "
            f"{self.expected_tok_s:.0f}) after {self.dip_s:.0f} s low{lowest}"
        )

    def payload(self) -> dict[str, Any]:
        """The numbers, for the event's payload (automations can template them)."""
        return {
            "kind": self.kind,
            "rate_tok_s": round(self.rate_tok_s, 1),
            "expected_tok_s": self.expected_tok_s,
            "threshold_tok_s": round(self.threshold_tok_s, 1),
            "shortfall_pct": round(100 * self.shortfall, 1),
            "window_s": self.window_s,
            "elapsed_s": round(self.elapsed_s, 1),
            "dip_s": round(self.dip_s, 1),
            "lowest_tok_s": None if self.lowest_tok_s is None else round(self.lowest_tok_s, 1),
            "summary": self.summary(),
        }


class ThroughputWatch:
    """The alarm's state machine, ok -> low -> ok, fed with (time, cumulative output tokens)."""

    def __init__(
        self,
        *,
        expected_tok_s: float,
        alarm_ratio: float,
        warmup_s: float,
        window_s: float,
        start: float,
    ) -> None:
        self.expected_tok_s = expected_tok_s
        self.threshold_tok_s = expected_tok_s * alarm_ratio
        self.recover_tok_s = min(expected_tok_s, self.threshold_tok_s * RECOVERY_MARGIN)
        self.warmup_s = warmup_s
        self.window = RateWindow(window_s)
        self.start = start
        self.state: Literal["ok", "low"] = "ok"
        self.rate: float | None = None
        self._dip_start = 0.0
        self._lowest = 0.0

    @classmethod
    def from_config(cls, alarm: ThroughputAlarm, start: float) -> ThroughputWatch | None:
        """The configured watch, or None when the alarm is off (no expected rate)."""
        if alarm.expected_tok_s is None:
            return None
        return cls(
            expected_tok_s=alarm.expected_tok_s,
            alarm_ratio=alarm.alarm_ratio,
            warmup_s=alarm.warmup_s,
            window_s=alarm.window_s,
            start=start,
        )

    def observe(self, t: float, total_tokens: int) -> ThroughputChange | None:
        """Add a sample; return the transition it causes, if any."""
        self.window.add(t, total_tokens)
        self.rate = rate = self.window.rate()
        if rate is None or t - self.start < self.warmup_s:
            return None
        if self.state == "ok":
            if rate >= self.threshold_tok_s:
                return None
            self.state = "low"
            self._dip_start, self._lowest = t, rate
            return self._change("low", t, rate)
        self._lowest = min(self._lowest, rate)
        if rate < self.recover_tok_s:
            return None
        self.state = "ok"
        return self._change("recovered", t, rate, dip_s=t - self._dip_start, lowest=self._lowest)

    def _change(
        self,
        kind: Literal["low", "recovered"],
        t: float,
        rate: float,
        dip_s: float = 0.0,
        lowest: float | None = None,
    ) -> ThroughputChange:
        return ThroughputChange(
            kind=kind,
            rate_tok_s=rate,
            expected_tok_s=self.expected_tok_s,
            threshold_tok_s=self.threshold_tok_s,
            window_s=self.window.window_s,
            elapsed_s=t - self.start,
            dip_s=dip_s,
            lowest_tok_s=lowest,
        )


class ThroughputMonitor:
    """The alarm as a run needs it: with a configured rate, the watch from the start; without
    one, the probe measures the run's own rate first (:mod:`.probe`) and the watch then
    compares the run with it. Fed (time, cumulative output tokens); :meth:`observe` says what
    happened, the flow only tells it."""

    def __init__(
        self,
        alarm: ThroughputAlarm,
        watch: ThroughputWatch | None,
        probe: ThroughputProbe | None,
    ) -> None:
        self.alarm = alarm
        self.watch = watch
        self.probe = probe
        self.baseline: Baseline | None = None  # the probe's, once measured

    @classmethod
    def from_config(cls, alarm: ThroughputAlarm, start: float) -> ThroughputMonitor | None:
        """The monitor a run needs; None when the alarm has nothing to compare with (no
        configured rate, probing off)."""
        watch = ThroughputWatch.from_config(alarm, start)
        probe = None if watch is not None else ThroughputProbe.from_config(alarm, start)
        if watch is None and probe is None:
            return None
        return cls(alarm, watch, probe)

    def observe(self, now: float, total_tokens: int) -> Baseline | ThroughputChange | None:
        """Add a sample; what it caused: the probe's baseline (the watch starts from it), a
        transition of the alarm, or nothing."""
        if self.watch is not None:
            return self.watch.observe(now, total_tokens)
        assert self.probe is not None
        baseline = self.probe.observe(now, total_tokens)
        if baseline is not None:
            self.baseline = baseline
            self.watch = ThroughputWatch(
                expected_tok_s=baseline.tok_s,
                alarm_ratio=self.alarm.alarm_ratio,
                warmup_s=0.0,  # the probe's warm-up is behind it
                window_s=self.alarm.window_s,
                start=now,
            )
        return baseline


@dataclass(slots=True)
class RunMeter:
    """The run's partitions' live :class:`Progress`, for the alarm, the parent's table and the
    summary. Partition sizes are known before the server starts (``expect``); a partition's
    counters join when it starts generating (``track``)."""

    sizes: dict[str, int] = field(default_factory=dict)
    _parts: dict[str, Progress] = field(default_factory=dict)

    def expect(self, sizes: dict[str, int]) -> None:
        """The run's partitions and their input lines, in the run's order."""
        self.sizes.update(sizes)

    def track(self, partition: str, progress: Progress) -> None:
        progress.total_lines = progress.total_lines or self.sizes.get(partition, 0)
        self._parts[partition] = progress

    def reused(self, partition: str, lines: int) -> None:
        """A partition an earlier attempt completed, reused: all its lines done, none by this
        attempt, so the progress table reads 100% for it and the run's percent counts it."""
        progress = Progress(total_lines=self.sizes.get(partition) or lines)
        progress.batch_skipped(lines)
        progress.finish()
        self.track(partition, progress)

    def finish(self, partition: str) -> None:
        progress = self._parts.get(partition)
        if progress is not None:
            progress.finish()

    def progress(self, partition: str) -> Progress | None:
        return self._parts.get(partition)

    def total_tokens(self) -> int:
        """Output tokens returned by the server in this run, all partitions (the alarm's count)."""
        return sum(p.output_tokens for p in self._parts.values())

    def timing(self, partition: str) -> tuple[float, float] | None:
        """(wall seconds, output tok/s) of a partition in this run, if it started generating."""
        progress = self._parts.get(partition)
        return None if progress is None else (progress.elapsed(), progress.tok_s())

    def totals(self) -> tuple[int, int]:
        """(lines done, input lines) over every partition of the run."""
        names = list(self.sizes) or list(self._parts)
        done = sum(p.done for p in self._parts.values())
        total = sum(self.sizes.get(n) or self._progress_total(n) for n in names)
        return done, total

    def _progress_total(self, name: str) -> int:
        progress = self._parts.get(name)
        return progress.total_lines if progress is not None else 0
