"""How outputs are checked, failures retried, and a slow run noticed."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from eagle3_datagen.config.base import PositiveSeconds, Seconds, StrictModel


class ValidationPolicy(StrictModel):
    """How strictly outputs are checked before they become training data."""

    truncation: Literal["keep", "reject"] = Field(title="Truncated outputs", default="keep")
    """'keep' stores length-truncated outputs, flagged; 'reject' rejects them."""
    require_answer: bool = Field(title="Require an answer", default=True)
    """Reject outputs with nothing after </think> (when not truncated)."""


class RetryPolicy(StrictModel):
    """Retries for transient failures: per request (transport errors, 429, 5xx, aborts), then
    per batch task (Prefect's task retries, once a request ran out of attempts)."""

    max_attempts: int = Field(title="Attempts per request", default=6, ge=1, le=100)
    """Tries per request, first included."""
    backoff_initial_s: Seconds = Field(title="Initial backoff (s)", default=1.0)
    """First backoff; doubles."""
    backoff_max_s: Seconds = Field(title="Max backoff (s)", default=60.0)
    """Backoff cap (jitter added)."""
    batch_retries: int = Field(default=2, ge=0, le=10, title="Batch task retries")
    """Prefect retries of a failed batch task, after its requests' own attempts."""
    batch_retry_delay_s: list[float] = Field(
        default_factory=lambda: [10.0, 60.0], min_length=1, title="Batch retry delays (s)"
    )
    """Wait before each batch retry; the last value repeats."""


class ThroughputAlarm(StrictModel):
    """Warn while the run makes far fewer output tokens per second than the hardware should.

    Against ``expected_tok_s``, or without it against the rate the run measures in its first
    minutes (``probe_s``; 0 turns the alarm off). The seed's 225 tok/s against 930-1350 expected
    went unnoticed for a whole run; this turns such a dip into a warning, an event and an artifact.
    """

    expected_tok_s: float | None = Field(default=None, gt=0, title="Expected output tok/s")
    """Output tokens per second the whole run should make (all partitions); empty: the run measures
    its own rate after the warm-up (probe_s) and alarms below that."""
    alarm_ratio: float = Field(default=0.5, gt=0, le=1, title="Alarm ratio")
    """Alarm when the windowed rate falls below expected x this ratio."""
    warmup_s: Seconds = Field(default=300.0, title="Warm-up (s)")
    """No alarm this long after generation starts (caches fill, slots ramp up)."""
    window_s: PositiveSeconds = Field(default=120.0, title="Window (s)")
    """The rate is averaged over this trailing window."""
    probe_s: Seconds = Field(default=300.0, title="Probe (s)")
    """Without an expected rate: measure the run's own rate over this long after the warm-up and use
    it as the alarm's baseline; 0 turns the alarm off."""
