"""A partition's live counters and the progress line the logs and the UI show."""

from __future__ import annotations

import time
from dataclasses import dataclass, field


@dataclass(slots=True)
class Progress:
    """Live counters of a partition, read by the progress reporter and the run's meter."""

    total_lines: int = 0
    done: int = 0
    accepted: int = 0
    rejected: int = 0
    errors: int = 0  # retried request failures
    output_tokens: int = 0
    started: float = field(default_factory=time.monotonic)

    def line(self) -> str:
        """The seed's log line: ``done/total (err) req/s avg_comp tok/s ETA``."""
        elapsed = max(time.monotonic() - self.started, 1e-9)
        rate = self.done / elapsed
        avg = self.output_tokens / self.done if self.done else 0.0
        remaining = max(self.total_lines - self.done, 0)
        eta = remaining / rate if rate > 0 else float("inf")
        eta_s = (
            f"{eta / 3600:.1f}h"
            if eta >= 3600
            else f"{eta / 60:.1f}m"
            if eta != float("inf")
            else "?"
        )
        return (
            f"{self.done}/{self.total_lines or '?'} ({self.errors} err) {rate:.1f} req/s "
            f"avg_comp={avg:.0f}tok {self.output_tokens / elapsed:.0f} tok/s ETA={eta_s}"
        )
