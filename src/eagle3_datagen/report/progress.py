"""A partition's live counters and the progress line the logs and the UI show.

Each input line counts once, however often its batch is retried: a batch's count is reset at
every attempt to what that attempt settled without a request (lines rejected before sending,
results kept in the journal) and grows by one per finished request. Output tokens are the
tokens the server returned in this run, each response once (a retry never resends a journaled
request); :meth:`Progress.tok_s` is the one output rate every report uses.

The ETA is this run's line rate applied to the lines left, as long as that rate still describes
the run. It stops being a number when no line has finished for longer than the ETA itself said
was left, or when requests were retried since the last line finished and the wait is past a
few average gaps between lines. A run's tail stalls that way (its last requests time out and
are retried), and a rate-based "0.2m" shown for minutes is wrong, not merely late. Then the ETA
says what is known: ``? (no line finished for 6.2m; 4 retries since)``.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from eagle3_datagen.write.shards import BatchSummary


def format_eta(seconds: float) -> str:
    if seconds == float("inf"):
        return "?"
    if seconds >= 3600:
        return f"{seconds / 3600:.1f}h"
    return f"{seconds / 60:.1f}m"


# Retries pending and no line for this many average gaps between lines: the run is stalling.
STALL_GAPS = 3


def format_wait(seconds: float) -> str:
    """A time already waited: ``45s`` under a minute (where ``0.0m`` would hide it), else as
    :func:`format_eta`."""
    return f"{seconds:.0f}s" if seconds < 60 else format_eta(seconds)


@dataclass(slots=True)
class Progress:
    """Live counters of a partition in this run, read by the reporters and the run's meter.

    ``clock`` is the time source (monotonic seconds), a parameter so tests can drive time;
    ``started`` defaults to its reading at construction.
    """

    total_lines: int = 0
    errors: int = 0  # retried request failures
    output_tokens: int = 0  # returned by the server in this run
    started: float = math.nan
    finished: float | None = None
    ended: bool = False  # the partition ended (end()): lines left are not to come
    clock: Callable[[], float] = field(default=time.monotonic, repr=False, compare=False)
    # Lines of batches committed before this run (skipped), and of batches committed in it.
    skipped_lines: int = 0
    # This run's committed batches: their totals, for the summary's "this run" row.
    lines: int = 0
    accepted: int = 0
    rejected: int = 0
    truncated: int = 0
    batches: int = 0
    rejects_by_reason: Counter[str] = field(default_factory=Counter)
    committed: list[int] = field(default_factory=list)  # indices of this run's batches
    # Batches in flight: lines settled in the current attempt; attempts per batch.
    _open: dict[int, int] = field(default_factory=dict)
    attempts: dict[int, int] = field(default_factory=dict)
    # When a request last finished in this run (None: none yet), and retries since then.
    _last_line_at: float | None = None
    _retries_since_line: int = 0
    # A speculating server's counters over this run's responses (report/acceptance.py).
    spec_verify_ct: int = 0
    spec_correct_drafts: int = 0

    def __post_init__(self) -> None:
        if math.isnan(self.started):
            self.started = self.clock()

    @property
    def done(self) -> int:
        """Input lines with an outcome: each line once, whatever the retries."""
        return self.skipped_lines + self.lines + sum(self._open.values())

    def batch_skipped(self, lines: int) -> None:
        """A batch committed by an earlier run: its lines are done, nothing generated."""
        self.skipped_lines += lines

    def attempt(self, index: int) -> None:
        """Batch ``index`` is being run (again): counts its attempts in this run."""
        self.attempts[index] = self.attempts.get(index, 0) + 1

    def batch_started(self, index: int, settled: int) -> None:
        """A (new or retried) attempt at a batch; ``settled`` lines need no request in it."""
        self._open[index] = settled

    def line_done(self, index: int, output_tokens: int = 0) -> None:
        """One request of batch ``index`` finished (a result, or a rejection by the server)."""
        self._open[index] = self._open.get(index, 0) + 1
        self.output_tokens += output_tokens
        self._last_line_at = self.clock()
        self._retries_since_line = 0

    def batch_committed(self, summary: BatchSummary) -> None:
        """The batch's Parquet and marker are written: its counts join this run's totals."""
        self._open.pop(summary.index, None)
        self.lines += summary.lines
        self.accepted += summary.accepted
        self.rejected += summary.rejected
        self.truncated += summary.truncated
        self.batches += 1
        self.committed.append(summary.index)
        self.rejects_by_reason.update(summary.rejects_by_reason)

    def batch_failed(self, index: int) -> None:
        """The attempt at batch ``index`` failed: its lines are not done (a retry redoes them)."""
        self._open.pop(index, None)

    def speculated(self, spec: dict[str, Any] | None) -> None:
        """A response's speculative fields (None: it had none) join this run's counters."""
        if spec is not None:
            self.spec_verify_ct += spec.get("spec_verify_ct") or 0
            self.spec_correct_drafts += spec.get("spec_num_correct_drafts") or 0

    def accept_length(self) -> float | None:
        """Accepted drafts + 1 per verify step over this run (SGLang's server-wide formula);
        None when no response had a verify step."""
        verify = self.spec_verify_ct
        return (self.spec_correct_drafts + verify) / verify if verify else None

    def retry(self) -> None:
        """A request failed and is being retried (a timeout, a 5xx, a lost connection)."""
        self.errors += 1
        self._retries_since_line += 1

    def finish(self) -> None:
        if self.finished is None:
            self.finished = self.clock()

    def end(self) -> None:
        """The partition ended (its clock stops): lines left now will not be done by this run,
        so no ETA is shown for them."""
        self.finish()
        self.ended = True

    def _now(self) -> float:
        return self.finished if self.finished is not None else self.clock()

    def elapsed(self) -> float:
        return max(self._now() - self.started, 1e-9)

    def tok_s(self) -> float:
        """Output tokens the server returned in this run per second of the partition's wall
        time (from its start to its end, or now): the rate the summary, the progress line and
        the parent's table show."""
        return self.output_tokens / self.elapsed()

    def tok_s_shown(self) -> float:
        """:meth:`tok_s` to one decimal, as the manifest keeps it: every surface shows this
        number (whole, by rounding it), so the summary's 320 is never a progress line's 319
        (319.46 rounds to 319 directly but to 320 through the stored 319.5)."""
        return round(self.tok_s(), 1)

    def line(self) -> str:
        """The seed's log line: ``done/total (err) req/s avg_comp tok/s ETA``.

        req/s and ETA count the lines settled in this run (earlier runs' batches excluded), so
        a resumed partition does not look faster than it is.
        """
        done = self.done
        generated = done - self.skipped_lines
        avg = self.output_tokens / generated if generated else 0.0
        text = (
            f"{done}/{self.total_lines or '?'} ({self.errors} err) {self.lines_per_s():.1f} req/s "
            f"avg_comp={avg:.0f}tok {self.tok_s_shown():.0f} tok/s ETA={self.eta()}"
        )
        accept = self.accept_length()
        return text if accept is None else f"{text} accept_len={accept:.2f}"

    def lines_per_s(self) -> float:
        """Lines settled per second in this run (earlier runs' batches not counted)."""
        return (self.done - self.skipped_lines) / self.elapsed()

    def eta(self) -> str:
        """Time left at this run's line rate: ``12.5m``, ``3.1h``, ``?`` before any line, or
        ``? (no line finished for 6.2m; 4 retries since)`` once the rate no longer describes
        the run (see the module doc); none once the partition ended with lines left."""
        remaining = max(self.total_lines - self.done, 0)
        if remaining == 0:
            return format_eta(0.0)
        if self.ended:  # the partition ended (failed, cancelled) with lines left: no ETA
            return f"- (ended with {remaining} lines left)"
        rate = self.lines_per_s()
        estimate = remaining / rate if rate > 0 else float("inf")
        quiet = self._now() - (
            self._last_line_at if self._last_line_at is not None else self.started
        )
        retries = self._retries_since_line
        # Lines finish at random: 3 average gaps without one happen ~5% of the time.
        long_gap = STALL_GAPS / rate if rate > 0 else 0.0
        if retries and quiet > long_gap:
            plural = "retry" if retries == 1 else "retries"
            return f"? (no line finished for {format_wait(quiet)}; {retries} {plural} since)"
        if quiet > estimate:
            return f"? (no line finished for {format_wait(quiet)})"
        return format_eta(estimate)

    def this_run(self) -> dict[str, Any]:
        """This run's numbers in the manifest summary's shape (batches committed in this run)."""
        return {
            "input_lines": self.total_lines,
            "lines_done": self.done,
            "accepted": self.accepted,
            "rejected": self.rejected,
            "rejects_by_reason": dict(sorted(self.rejects_by_reason.items())),
            "truncated": self.truncated,
            "truncation_rate": round(self.truncated / self.accepted, 4) if self.accepted else 0.0,
            "output_tokens": self.output_tokens,
            "wall_s": round(self.elapsed(), 1),
            "output_tok_s": self.tok_s_shown(),
            **self._acceptance(),
        }

    def _acceptance(self) -> dict[str, Any]:
        accept = self.accept_length()
        if accept is None:
            return {}
        return {"spec_accept_length": round(accept, 4), "spec_verify_ct": self.spec_verify_ct}
