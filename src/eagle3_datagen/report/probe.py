"""The throughput alarm's baseline when nobody configured one: the run's own rate, measured early.

Setting ``throughput.expected_tok_s`` needs a number for this model, node and workload that few
users have. Without it the run measures the rate it makes over ``probe_s`` seconds once the
warm-up is over (caches filled, slots ramped up), and the alarm then watches for a fall below
that. A probe cannot see a server that was slow from the start (only a configured rate can);
it catches what the seed's run needed: a run that later fell far below its own early rate.
No Prefect here: ``throughput.ThroughputMonitor`` feeds it and then watches against its result.
"""

from __future__ import annotations

from dataclasses import dataclass

from eagle3_datagen.config import ThroughputAlarm


@dataclass(frozen=True, slots=True)
class Baseline:
    """The measured rate: ``tok_s`` over ``window_s`` seconds, ending ``elapsed_s`` in."""

    tok_s: float
    window_s: float
    elapsed_s: float  # since generation started

    def __str__(self) -> str:
        """The summary's note."""
        return f"throughput baseline {self.tok_s:.0f} tok/s (measured, no expected_tok_s)"

    def summary(self) -> str:
        return (
            f"throughput baseline {self.tok_s:.0f} output tok/s, measured over "
            f"{self.window_s:.0f} s after a {self.elapsed_s - self.window_s:.0f} s warm-up "
            "(throughput.expected_tok_s not set); the alarm compares the run with it from now on"
        )


class ThroughputProbe:
    """Fed (time, cumulative output tokens) like the alarm; returns the :class:`Baseline` once.

    The window opens at the first sample after ``warmup_s`` and closes ``probe_s`` later. A
    window in which no token came (a stalled server, an empty run) measures nothing: the probe
    starts again at its end rather than set a baseline of zero.
    """

    def __init__(self, *, warmup_s: float, probe_s: float, start: float) -> None:
        self.warmup_s = warmup_s
        self.probe_s = probe_s
        self.start = start
        self.baseline: Baseline | None = None
        self._anchor: tuple[float, int] | None = None

    @classmethod
    def from_config(cls, alarm: ThroughputAlarm, start: float) -> ThroughputProbe | None:
        """The probe a run needs: none when the rate is configured or probing is off."""
        if alarm.expected_tok_s is not None or alarm.probe_s <= 0:
            return None
        return cls(warmup_s=alarm.warmup_s, probe_s=alarm.probe_s, start=start)

    def observe(self, t: float, total_tokens: int) -> Baseline | None:
        """Add a sample; the baseline on the sample that completes the window, else None."""
        if self.baseline is not None or t - self.start < self.warmup_s:
            return None
        if self._anchor is None:
            self._anchor = (t, total_tokens)
            return None
        t0, n0 = self._anchor
        if t - t0 < self.probe_s:
            return None
        if total_tokens <= n0:
            self._anchor = (t, total_tokens)
            return None
        self.baseline = Baseline((total_tokens - n0) / (t - t0), t - t0, t - self.start)
        return self.baseline
