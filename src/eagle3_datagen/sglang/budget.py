"""A server-wide budget shared by all partitions: requests in flight and KV tokens reserved.

Why: each partition has its tier's concurrency, but partitions run side by side against one
server. What fills the server's KV cache is, per request in flight, prompt + max_new_tokens
(SGLang reserves room for the whole generation), so a LONG tier (16k max tokens) can crowd out
everything else. Requests wait in one FIFO queue: a big request at the head is never starved by
a stream of small ones, and a small one is not held back while the head fits.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator
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
        self._waiters: deque[tuple[int, asyncio.Future[None]]] = deque()

    @property
    def unlimited(self) -> bool:
        return self.max_requests is None and self.max_tokens is None

    def _fits(self, tokens: int) -> bool:
        if self.max_requests is not None and self.requests >= self.max_requests:
            return False
        # A single request larger than the whole token budget still runs, alone.
        return not (
            self.max_tokens is not None and self.requests and self.tokens + tokens > self.max_tokens
        )

    def _take(self, tokens: int) -> None:
        self.requests += 1
        self.tokens += tokens
        self.peak_requests = max(self.peak_requests, self.requests)
        self.peak_tokens = max(self.peak_tokens, self.tokens)

    def _wake(self) -> None:
        while self._waiters and self._fits(self._waiters[0][0]):
            tokens, fut = self._waiters.popleft()
            if not fut.done():
                self._take(tokens)
                fut.set_result(None)

    @asynccontextmanager
    async def reserve(self, tokens: int) -> AsyncIterator[None]:
        """Hold one request slot and ``tokens`` KV tokens for the duration of the block."""
        if self.unlimited:
            yield
            return
        if not self._waiters and self._fits(tokens):
            self._take(tokens)
        else:
            fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._waiters.append((tokens, fut))
            try:
                await fut
            except asyncio.CancelledError:
                if fut.done() and not fut.cancelled():
                    self._release(tokens)  # granted just as we were cancelled
                else:
                    self._waiters = deque(w for w in self._waiters if w[1] is not fut)
                    self._wake()
                raise
        try:
            yield
        finally:
            self._release(tokens)

    def _release(self, tokens: int) -> None:
        self.requests -= 1
        self.tokens -= tokens
        self._wake()
