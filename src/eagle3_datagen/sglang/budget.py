"""A server-wide budget shared by all partitions: requests in flight and KV tokens reserved.

Why: each partition has its tier's concurrency, but partitions run side by side against one
server. What fills the server's KV cache is, per request in flight, prompt + max_new_tokens
(SGLang reserves room for the whole generation), so a LONG tier (16k max tokens) can crowd out
everything else. Waiting requests are queued per share (a partition): a freed place goes to
the share with the fewest requests in flight, oldest request first, so partitions on one server
get equal places whatever their batch sizes; within a share the queue is FIFO, so a big request
at the head is never starved by a stream of small ones.

The request limit can move while the run goes: ``concurrency: auto`` has a controller
(``sglang/concurrency.py``) that sets it from the server's load.
"""

from __future__ import annotations

import asyncio
import itertools
from collections import deque
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager


class ServerBudget:
    """Admission control in front of one server (or router)."""

    def __init__(self, max_requests: int | None = None, max_tokens: int | None = None) -> None:
        self.max_requests = max_requests
        self.max_tokens = max_tokens
        self.requests = 0
        self.tokens = 0
        self.peak_requests = 0
        self.peak_tokens = 0
        self.by_share: dict[str, int] = {}  # requests in flight per share
        # Retractions the server reported in finished responses (meta_info.num_retractions):
        # the auto controller's signal where the server has no /metrics.
        self.retractions_reported = 0
        self._queues: dict[str, deque[tuple[int, int, asyncio.Future[None]]]] = {}
        self._seq = itertools.count()
        # Called on every reservation: a controller starts itself on the running loop.
        self.on_reserve: Callable[[], None] | None = None

    @property
    def unlimited(self) -> bool:
        return self.max_requests is None and self.max_tokens is None and self.on_reserve is None

    @property
    def waiting(self) -> int:
        return sum(len(q) for q in self._queues.values())

    def set_max_requests(self, limit: int | None) -> None:
        """Move the request limit; a raised limit lets waiting requests in at once."""
        self.max_requests = limit
        self._wake()

    def _fits(self, tokens: int) -> bool:
        if self.max_requests is not None and self.requests >= self.max_requests:
            return False
        # A single request larger than the whole token budget still runs, alone.
        return not (
            self.max_tokens is not None and self.requests and self.tokens + tokens > self.max_tokens
        )

    def _take(self, share: str, tokens: int) -> None:
        self.requests += 1
        self.tokens += tokens
        self.by_share[share] = self.by_share.get(share, 0) + 1
        self.peak_requests = max(self.peak_requests, self.requests)
        self.peak_tokens = max(self.peak_tokens, self.tokens)

    def _next_share(self) -> str | None:
        """The share whose head goes next: fewest in flight, then the oldest head."""
        best: tuple[int, int] | None = None
        pick = None
        for share, queue in self._queues.items():
            if queue:
                key = (self.by_share.get(share, 0), queue[0][1])
                if best is None or key < best:
                    best, pick = key, share
        return pick

    def _wake(self) -> None:
        while True:
            share = self._next_share()
            if share is None:
                return
            queue = self._queues[share]
            tokens, _, fut = queue[0]
            if fut.done():  # cancelled while waiting
                queue.popleft()
                continue
            if not self._fits(tokens):
                return
            queue.popleft()
            self._take(share, tokens)
            fut.set_result(None)

    @asynccontextmanager
    async def reserve(self, tokens: int, share: str = "") -> AsyncIterator[None]:
        """Hold one request place and ``tokens`` KV tokens for the duration of the block."""
        if self.on_reserve is not None:
            self.on_reserve()
        if self.unlimited:
            yield
            return
        if not self.waiting and self._fits(tokens):
            self._take(share, tokens)
        else:
            fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            queue = self._queues.setdefault(share, deque())
            queue.append((tokens, next(self._seq), fut))
            try:
                await fut
            except asyncio.CancelledError:
                if fut.done() and not fut.cancelled():
                    self._release(share, tokens)  # granted just as we were cancelled
                else:
                    self._queues[share] = deque(w for w in queue if w[2] is not fut)
                    self._wake()
                raise
        try:
            yield
        finally:
            self._release(share, tokens)

    def _release(self, share: str, tokens: int) -> None:
        self.requests -= 1
        self.tokens -= tokens
        self.by_share[share] -= 1
        self._wake()
