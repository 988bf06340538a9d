"""Latency model and load statistics, so a benchmark can measure how well a client keeps slots busy.

A request holds one of ``slots`` decode slots for ``prefill + tokens * decode`` seconds; the rest
wait in FIFO order. The default (no slots limit, zero times) answers at once.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class LatencyModel:
    """Per-request costs: prefill throughput and per-token decode time (0 = instant)."""

    prefill_tokens_per_s: float = 0.0
    decode_ms_per_token: float = 0.0

    @property
    def is_zero(self) -> bool:
        return self.prefill_tokens_per_s <= 0 and self.decode_ms_per_token <= 0

    def prefill_s(self, prompt_tokens: int) -> float:
        if self.prefill_tokens_per_s <= 0:
            return 0.0
        return prompt_tokens / self.prefill_tokens_per_s

    def decode_s(self, tokens: int) -> float:
        return tokens * self.decode_ms_per_token / 1000.0


class Stats:
    """Counters behind ``GET /emulator/stats``; ``slot_busy_s`` integrates running over time."""

    def __init__(self, slots: int | None) -> None:
        self.slots = slots
        self.running = 0
        self.queued = 0
        self.reset()

    def reset(self) -> None:
        """Zero the counters; requests in flight stay counted in ``running``/``queued``."""
        now = time.monotonic()
        self.http_requests = 0
        self.requests = 0
        self.finished = 0
        self.finish_types: dict[str, int] = {}
        self.faults: dict[str, int] = {}
        self.errors_4xx = 0
        self.peak_running = self.running
        self.peak_queued = self.queued
        self.slot_busy_s = 0.0
        self.prompt_tokens = 0
        self.output_tokens = 0
        self.first_request: float | None = None
        self.last_change = now
        self.last_finish: float | None = None

    def _advance(self) -> float:
        now = time.monotonic()
        self.slot_busy_s += self.running * (now - self.last_change)
        self.last_change = now
        return now

    def http_request(self) -> None:
        self.http_requests += 1
        if self.first_request is None:
            self.first_request = time.monotonic()

    def start_running(self) -> None:
        self._advance()
        self.running += 1
        if self.running > self.peak_running:
            self.peak_running = self.running

    def stop_running(self) -> None:
        self._advance()
        self.running -= 1

    def enqueue(self) -> None:
        self.queued += 1
        if self.queued > self.peak_queued:
            self.peak_queued = self.queued

    def dequeue(self) -> None:
        self.queued -= 1

    def finish(self, kind: str, prompt_tokens: int, output_tokens: int) -> None:
        self.finished += 1
        self.finish_types[kind] = self.finish_types.get(kind, 0) + 1
        self.prompt_tokens += prompt_tokens
        self.output_tokens += output_tokens
        self.last_finish = time.monotonic()

    def fault(self, kind: str) -> None:
        self.faults[kind] = self.faults.get(kind, 0) + 1

    def snapshot(self) -> dict[str, Any]:
        now = self._advance()
        elapsed = 0.0 if self.first_request is None else now - self.first_request
        util = None
        if self.slots and elapsed > 0:
            util = self.slot_busy_s / (self.slots * elapsed)
        return {
            "http_requests": self.http_requests,
            "requests": self.requests,
            "finished": self.finished,
            "finish_types": dict(self.finish_types),
            "errors_4xx": self.errors_4xx,
            "faults": dict(self.faults),
            "running": self.running,
            "peak_running": self.peak_running,
            "queued": self.queued,
            "peak_queued": self.peak_queued,
            "slots": self.slots,
            "slot_busy_s": self.slot_busy_s,
            "elapsed_s": elapsed,
            "slot_utilization": util,
            "prompt_tokens": self.prompt_tokens,
            "output_tokens": self.output_tokens,
            "output_tokens_per_s": self.output_tokens / elapsed if elapsed > 0 else None,
        }


class SlotPool:
    """FIFO decode slots: a request takes one at once or waits its turn in the queue."""

    def __init__(self, slots: int | None, stats: Stats) -> None:
        self.slots = slots
        self.stats = stats
        self._waiters: deque[asyncio.Future[bool]] = deque()

    def try_acquire(self) -> bool:
        """Take a slot without waiting (the fast path); False if one must queue."""
        if self.slots is not None and (self.stats.running >= self.slots or self._waiters):
            return False
        self.stats.start_running()
        return True

    def waiter(self) -> asyncio.Future[bool]:
        """Join the queue; the future turns True when a slot is handed over."""
        fut: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        self.stats.enqueue()
        return fut

    def leave_queue(self, fut: asyncio.Future[bool]) -> None:
        """Drop a waiter whose client went away before it got a slot."""
        try:
            self._waiters.remove(fut)
        except ValueError:
            return
        self.stats.dequeue()

    def release(self) -> None:
        """Free a slot, handing it straight to the oldest live waiter."""
        self.stats.stop_running()
        while self._waiters and (self.slots is None or self.stats.running < self.slots):
            fut = self._waiters.popleft()
            self.stats.dequeue()
            if fut.done():
                continue
            self.stats.start_running()
            fut.set_result(True)
