"""``concurrency: auto``: steer the requests in flight from the server's own load.

Why: a server's best concurrency moves with prompt and output lengths, KV memory and cache, and
hand tuning (the seed's 150 / 32, found over several rounds) leaves throughput behind or, on a
KV-poor server, makes SGLang retract requests (their KV is thrown away and recomputed). SGLang
admits requests itself, by its KV estimate (``new_token_ratio``), so what a client controls is
only how many it offers. The controller reads the server's load every ``interval_s`` and sets
the server-wide budget's request limit (the budget shares it fairly across partitions):

- **retractions** since the last reading (the KV pool ran out): back off to 85% of what the
  server held, and hold for two readings; once per cut: while more are in flight than the last
  cut allows (running requests only leave as they finish), further retractions cut nothing.
  90% of what was in flight when they were seen (two or more at once: a lone one is SGLang's
  own optimism, seen at any concurrency) becomes a **ceiling** growth stops at,
  raised by 5% only after two ceilings' worth of requests finished without a retraction
  (growing back into retractions every few readings cost more than it made: figure (e)
  reasoning, 66-113 retractions and 0.962x the best static, which had none);
- **a queue** on the server longer than a few requests (25% of those running, at least 2) for
  three readings in a row: the server runs all its KV allows and the rest only wait; trim the
  limit towards running + that small queue (by at most 10% a reading), so the server always
  has the next requests at hand but is never offered a pile it would over-admit as
  ``new_token_ratio`` decays (10% left a KV-bound server short: SGLang admits by its estimate,
  and a queue of 2-4 did not keep its places filled, figure (e) kv-poor 0.89-0.95x of the best
  static, 0.98x with 25%). A shorter-lived
  queue is prefill backlog (SGLang prefills at most ``chunked_prefill_size`` tokens a step):
  the limit then stays where it is;
- otherwise, when the limit is what holds requests back (>= 90% of it in flight) and the KV
  pool is below 92% used, or the server has fewer than 2 requests waiting (a full pool with
  nothing at hand idles a place whenever a request finishes: the next one is still on its way):
  grow, doubling until the first trim or retraction or until the pool is 46% used (slow start:
  twice the KV would no longer fit, and the running requests' KV still grows as they decode),
  then by 5% per reading.

The limit counts every request in flight on the server but holds back only the partitions of
auto tiers (static tiers keep their concurrency), and never goes above the user's
``server.limits.max_requests_in_flight`` (a ceiling) or ``auto_concurrency.maximum``.

Where the load comes from is found at the first reading (``sglang/load.py``): SGLang's
``/metrics``, else ``/v1/loads``, else (a router's or a proxy's ``/metrics``, nothing at
``/v1/loads``) the responses alone: the retractions they report, with in flight standing in for
running; one warning says which. Every change is logged with the reading behind it, and is a
row of :attr:`ConcurrencyController.changes` (time, limit, running, queued, KV usage,
retractions, reason) handed to ``on_change`` (the flow makes it an event and a table).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from eagle3_datagen.config import AutoConcurrency
from eagle3_datagen.sglang.budget import ServerBudget
from eagle3_datagen.sglang.load import LOADS, METRICS, RESPONSES, LoadReader, LoadSample

USAGE_HIGH = 0.92
BACKOFF = 0.85
GROWTH = 0.05
QUEUE_SHARE = 0.25
MIN_QUEUE = 2
HOLD_READINGS = 2
QUEUE_READINGS = 3
TRIM = 0.9  # a trim takes at most 10% off: one reading's running count is noisy
CEILING = 0.9  # after retractions, never grow past 90% of the running count they began at
CEILING_TURNOVERS = 2  # ... until this many ceilings' worth of requests finished without one
# A lone retraction is SGLang's own optimism (a KV-bound server retracts now and then at any
# concurrency: kv-poor's statics 64, 100 and 256 each had 1-5); a ceiling set by one held
# kv-poor at 33-48 in flight with the pool 60-80% used and nothing queued (0.96x).
CEILING_MIN_RETRACTED = 2


@dataclass(frozen=True)
class Decision:
    """One reading and what it did to the limit (kept for logs, tests and benchmarks)."""

    t: float
    limit: int
    in_flight: int
    sample: LoadSample
    reason: str
    retracted: int = 0  # retractions since the reading before
    source: str = METRICS  # where the reading came from (sglang/load.py)
    cap: int | None = None  # the retraction ceiling after this reading, if any


def change_row(d: Decision, previous: int) -> dict[str, Any]:
    """One line of the limit-changes table: when, to what, the reading behind it, why."""
    return {
        "time": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "limit": d.limit,
        "previous": previous,
        "in_flight": d.in_flight,
        "running": d.sample.running,
        "queued": d.sample.queued,
        "token_usage": round(d.sample.token_usage, 3),
        "retractions": d.retracted,
        "source": d.source,
        "reason": d.reason,
    }


class ConcurrencyController:
    """Sets ``budget``'s request limit from ``reader``'s readings; runs as a background task."""

    def __init__(
        self,
        budget: ServerBudget,
        reader: LoadReader,
        settings: AutoConcurrency,
        log: Callable[[str], None] | None = None,
        *,
        warn: Callable[[str], None] | None = None,
        ceiling: int | None = None,
        on_change: Callable[[dict[str, Any]], None] | None = None,
    ) -> None:
        self.budget = budget
        self.reader = reader
        self.settings = settings
        self.log = log
        self.warn = warn or log
        self.on_change = on_change
        # The user's server.limits.max_requests_in_flight is a ceiling, never a starting point.
        self.maximum = min(settings.maximum, ceiling) if ceiling else settings.maximum
        self.minimum = min(settings.minimum, self.maximum)
        self.limit = max(self.minimum, min(settings.initial, self.maximum))
        self.changes: list[dict[str, Any]] = []
        self._detected = False
        self._new_retracted = 0
        self.slow_start = True
        self.hold = 0
        self.queued_readings = 0
        self._last_retracted: int | None = None
        self.retractions = 0
        # Retraction ceiling: where retractions began, less 10%; rises 5% after quiet turnovers.
        self.cap: int | None = None
        self._cap_mark = 0  # budget.finished when the ceiling was set or raised
        self.history: list[Decision] = []
        self.errors = 0
        self._task: asyncio.Task[None] | None = None
        budget.set_adaptive_limit(self.limit)
        budget.on_reserve = self.ensure_running

    def ensure_running(self) -> None:
        """Start the reading loop on the running event loop (first reservation starts it)."""
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._loop())

    def decide(self, s: LoadSample, in_flight: int) -> tuple[int, str]:
        """The next limit after reading ``s`` with ``in_flight`` requests out; and why."""
        limit = self.limit
        new_retracted = 0
        # Without /metrics (no counter), the retractions finished responses reported.
        total = s.retracted_total
        if total is None:
            total = self.budget.retractions_reported
        if self._last_retracted is not None:
            new_retracted = max(0, total - self._last_retracted)
        self._last_retracted = total
        self.retractions += new_retracted
        self._new_retracted = new_retracted
        allowed_queue = max(MIN_QUEUE, math.ceil(QUEUE_SHARE * s.running))
        long_queue = s.queued > allowed_queue
        self.queued_readings = self.queued_readings + 1 if long_queue else 0
        if new_retracted and in_flight > limit:
            reason = f"{new_retracted} retracted while in flight drains to the last cut: wait"
        elif new_retracted:
            limit, reason = self._retracted(limit, s, in_flight, new_retracted)
        elif self.queued_readings >= QUEUE_READINGS:
            limit = min(limit, max(s.running + allowed_queue, int(limit * TRIM)))
            reason = f"queue {s.queued} > {allowed_queue} for {self.queued_readings} readings: trim"
            self.slow_start = False
        elif self.hold:
            self.hold -= 1
            reason = "hold after retraction"
        elif long_queue:
            reason = "prefill backlog: wait"
        elif in_flight < 0.9 * limit:
            reason = "steady"
        elif s.token_usage < USAGE_HIGH or s.queued < MIN_QUEUE:
            # Slow start doubles only while twice the KV in use would still fit: the running
            # requests' KV grows as they decode, so a pool already half used when the limit
            # doubles fills long after (figure (e) reasoning: 256 -> 512 at 74% used, then 110
            # retracted at once and 400 in flight for the rest of the run).
            if self.slow_start and s.token_usage * 2 >= USAGE_HIGH:
                self.slow_start = False
            step = limit if self.slow_start else max(1, math.ceil(limit * GROWTH))
            limit, reason = self._up(limit, step, "slow start" if self.slow_start else "grow")
        else:
            reason = "steady"
        limit = max(self.minimum, min(self.maximum, limit))
        return limit, reason

    def _retracted(self, limit: int, s: LoadSample, in_flight: int, count: int) -> tuple[int, str]:
        """Back off to 85% of what the server held, and make 90% of what was in flight when
        the retractions were seen a ceiling growth stops at (growing back into them cost more
        than it made, figure (e) reasoning)."""
        level = min(limit, in_flight)
        self.slow_start, self.hold = False, HOLD_READINGS
        limit = int(min(limit, s.running + s.queued) * BACKOFF)
        if count < CEILING_MIN_RETRACTED:
            return limit, f"{count} retracted at {level} in flight: back off"
        self.cap = max(self.minimum, min(int(level * CEILING), self.cap or self.maximum))
        self._cap_mark = self.budget.finished
        limit = min(limit, self.cap)
        return limit, f"{count} retracted at {level} in flight: back off, ceiling {self.cap}"

    def _up(self, limit: int, step: int, reason: str) -> tuple[int, str]:
        """``limit + step``, but never past the retraction ceiling; one that held for
        ``CEILING_TURNOVERS`` turnovers without a retraction rises by 5%."""
        cap = self.cap
        if cap is not None and limit >= cap:
            if self.budget.finished - self._cap_mark < CEILING_TURNOVERS * cap:
                return limit, f"at the retraction ceiling {cap}"
            self.cap = cap = cap + max(1, math.ceil(cap * GROWTH))
            self._cap_mark = self.budget.finished
            reason = f"no retraction for {CEILING_TURNOVERS} turnovers: ceiling {cap}"
        return (limit + step if cap is None else min(limit + step, cap)), reason

    def apply(self, s: LoadSample | None) -> Decision:
        """Read ``s`` (None: no server reading, the responses alone), move the budget's limit,
        log and record a change; returns the decision."""
        in_flight = self.budget.requests
        source = METRICS
        if s is None:  # in flight stands in for running; retractions from the responses
            s = LoadSample(in_flight, 0, 0.0, 0.0, None)
            source = RESPONSES
        elif s.retracted_total is None:
            source = LOADS
        limit, reason = self.decide(s, in_flight)
        decision = Decision(
            time.monotonic(), limit, in_flight, s, reason, self._new_retracted, source, self.cap
        )
        self.history.append(decision)
        if limit != self.limit:
            if self.log is not None:
                self.log(
                    f"auto concurrency {self.limit} -> {limit} ({reason}; server running "
                    f"{s.running}, queued {s.queued}, KV {s.token_usage:.0%}, "
                    f"{s.gen_throughput:.0f} tok/s; {in_flight} in flight; from {source})"
                )
            self._record(decision, self.limit)
            self.limit = limit
            self.budget.set_adaptive_limit(limit)
        return decision

    def _record(self, decision: Decision, previous: int) -> None:
        row = change_row(decision, previous)
        self.changes.append(row)
        if self.on_change is not None:
            try:
                self.on_change(row)
            except Exception as err:  # a report must never stop the steering
                if self.log is not None:
                    self.log(f"auto concurrency: change not published: {err!r}")

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.settings.interval_s)
            try:
                if not self._detected:  # once: where the load comes from
                    self._detected = True
                    await self.reader.detect()
                sample = await self.reader.read()
                notes = self.reader.take_notes()
                if notes and self.warn is not None:  # one warning per finding
                    self.warn("concurrency auto: " + "; ".join(notes))
            except Exception as err:  # a server that cannot be read keeps the last limit
                self.errors += 1
                if self.log is not None and self.errors in (1, 10, 100):
                    self.log(f"auto concurrency: cannot read the server's load: {err!r}")
                continue
            self.apply(sample)

    async def aclose(self) -> None:
        self.budget.on_reserve = None
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, RuntimeError):
                await self._task
            self._task = None
        await self.reader.aclose()
