"""A server-wide budget shared by all partitions: requests in flight and KV tokens reserved.

Why: each partition has its tier's concurrency, but partitions run side by side against one
server. What fills the server's KV cache is, per request in flight, prompt + max_new_tokens
(SGLang reserves room for the whole generation), so a LONG tier (16k max tokens) can crowd out
everything else. Waiting requests are queued per share (a partition): a freed place goes to
the share with the fewest KV tokens in flight, oldest request first, so partitions on one
server get equal parts of the KV cache whatever their lengths (a LONG partition whose requests
hold 16x the tokens of a SHORT one's gets a sixteenth of its places, not as many). A request's
weight is its reservation (prompt + max_tokens) scaled by what its share's finished requests
really held (prompt + output, :meth:`observe`), so a tier whose outputs stop far short of
max_tokens is not held back for room it never uses. Within a share the queue is FIFO, so a big
request at the head is never starved by a stream of small ones.

``longest_first`` (a run with ``concurrency: auto`` tiers, ``sglang/session.py``) picks the
share for makespan instead: a freed place goes to the share whose head request is expected to
run longest, i.e. to hold the most KV tokens (its reservation, prompt + max_tokens, times the
share's observed fill: what its outputs really reach), and a share with nothing waiting leaves
its places to the others. Why: a request's decode takes as many server steps as it has output
tokens, so the long ones that start last set the drain at the end of a run; started first, the
long tier's outputs decode while the shorter tiers fill the server around them, and the tier
that is left takes the capacity the others free (``benchmarks/makespan.py``, figure (f)).
Within a share the order stays FIFO: the batch runner sends each batch's longest prompts first
(``generate/converse.py``), and batches keep finishing in order, so a partition's window of
batches keeps flowing.

Two request limits: ``max_requests``, the user's ``server.limits.max_requests_in_flight``, a ceiling
nothing exceeds; and ``adaptive_limit``, which ``concurrency: auto``'s controller
(``sglang/concurrency.py``) moves while the run goes. The adaptive limit counts every request
in flight on the server but holds back only the shares it steers (``adaptive``: partitions of
auto tiers); partitions of static tiers keep their own concurrency.
"""

from __future__ import annotations

import asyncio
import itertools
from collections import deque
from collections.abc import Callable, Iterable

# How fast a share's observed fill (KV tokens held / reserved) follows new results.
_FILL_EWMA = 0.05


class ServerBudget:
    """Admission control in front of one server (or router)."""

    def __init__(
        self,
        max_requests: int | None = None,
        max_tokens: int | None = None,
        adaptive: Iterable[str] | None = None,
        *,
        longest_first: bool = False,
    ) -> None:
        self.max_requests = max_requests
        self.max_tokens = max_tokens
        # The shares the adaptive limit holds back (None: every share).
        self.adaptive = None if adaptive is None else frozenset(adaptive)
        self.adaptive_limit: int | None = None
        self.longest_first = longest_first
        self.requests = 0
        self.tokens = 0
        self.peak_requests = 0
        self.peak_tokens = 0
        self.by_share: dict[str, int] = {}  # requests in flight per share
        self.weight_by_share: dict[str, float] = {}  # estimated KV tokens in flight per share
        self.fill: dict[str, float] = {}  # per share: KV tokens held / reserved, observed
        # Retractions the server reported in finished responses (meta_info.num_retractions):
        # the auto controller's signal where the server has no usable /metrics.
        self.retractions_reported = 0
        # Requests that left the server (finished, failed or cancelled): the controller's clock
        # for how long a retraction ceiling holds (a turnover, whatever the time scale).
        self.finished = 0
        self._queues: dict[str, deque[tuple[int, int, asyncio.Future[float]]]] = {}
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
        """Move the ceiling; a raised one lets waiting requests in at once."""
        self.max_requests = limit
        self._wake()

    def set_adaptive_limit(self, limit: int | None) -> None:
        """Move the controller's limit (it never goes above the ceiling)."""
        if limit is not None and self.max_requests is not None:
            limit = min(limit, self.max_requests)
        self.adaptive_limit = limit
        self._wake()

    def observe(self, share: str, reserved: int, held: int) -> None:
        """A finished request of ``share`` held ``held`` KV tokens (prompt + output) of the
        ``reserved`` it was admitted with: later requests of the share weigh accordingly."""
        if reserved <= 0:
            return
        ratio = min(1.0, held / reserved)
        old = self.fill.get(share)
        self.fill[share] = ratio if old is None else old + _FILL_EWMA * (ratio - old)

    def _blocked_by_adaptive(self, share: str) -> bool:
        limit = self.adaptive_limit
        return limit is not None and self._steered(share) and self.requests >= limit

    def _steered(self, share: str) -> bool:
        return self.adaptive is None or share in self.adaptive

    def _fits(self, tokens: int) -> bool:
        """Within the ceiling and the token budget (the limits every share obeys)."""
        if self.max_requests is not None and self.requests >= self.max_requests:
            return False
        # A single request larger than the whole token budget still runs, alone.
        return not (
            self.max_tokens is not None and self.requests and self.tokens + tokens > self.max_tokens
        )

    def _take(self, share: str, tokens: int) -> float:
        weight = tokens * self.fill.get(share, 1.0)
        self.requests += 1
        self.tokens += tokens
        self.by_share[share] = self.by_share.get(share, 0) + 1
        self.weight_by_share[share] = self.weight_by_share.get(share, 0.0) + weight
        self.peak_requests = max(self.peak_requests, self.requests)
        self.peak_tokens = max(self.peak_tokens, self.tokens)
        return weight

    def _next_share(self, skip_adaptive: bool) -> str | None:
        """The share whose head goes next: fewest KV tokens in flight, then the oldest head; or,
        longest first, the head expected to hold the most KV tokens, then the oldest."""
        best: tuple[float, int] | None = None
        pick = None
        for share, queue in self._queues.items():
            if queue and not (skip_adaptive and self._steered(share)):
                tokens, seq, _ = queue[0]
                if self.longest_first:
                    key = (-tokens * self.fill.get(share, 1.0), seq)
                else:
                    key = (self.weight_by_share.get(share, 0.0), seq)
                if best is None or key < best:
                    best, pick = key, share
        return pick

    def _wake(self) -> None:
        skip_adaptive = False  # once the adaptive limit holds, only static shares may go on
        while True:
            share = self._next_share(skip_adaptive)
            if share is None:
                return
            queue = self._queues[share]
            tokens, _, fut = queue[0]
            if fut.done():  # cancelled while waiting
                queue.popleft()
                continue
            if not self._fits(tokens):
                return
            if self._blocked_by_adaptive(share):
                skip_adaptive = True
                continue
            queue.popleft()
            fut.set_result(self._take(share, tokens))

    def reserve(self, tokens: int, share: str = "") -> Reservation:
        """Hold one request place and ``tokens`` KV tokens for the duration of an ``async
        with`` block."""
        return Reservation(self, tokens, share)

    async def _acquire(self, tokens: int, share: str) -> float | None:
        """Wait for a place; its weight, or None where nothing limits (nothing to release)."""
        if self.on_reserve is not None:
            self.on_reserve()
        if self.unlimited and self.adaptive_limit is None:
            return None
        if not self.waiting and self._fits(tokens) and not self._blocked_by_adaptive(share):
            return self._take(share, tokens)
        fut: asyncio.Future[float] = asyncio.get_running_loop().create_future()
        queue = self._queues.setdefault(share, deque())
        queue.append((tokens, next(self._seq), fut))
        self._wake()  # a static share may go past auto shares the adaptive limit holds
        try:
            return await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():
                self._release(share, tokens, fut.result())  # granted as we were cancelled
            else:
                self._queues[share] = deque(w for w in queue if w[2] is not fut)
                self._wake()
            raise

    def _release(self, share: str, tokens: int, weight: float) -> None:
        self.requests -= 1
        self.finished += 1
        self.tokens -= tokens
        self.by_share[share] -= 1
        self.weight_by_share[share] -= weight
        self._wake()


class Reservation:
    """One request's place in a :class:`ServerBudget`, held for an ``async with`` block.

    A plain class, not ``@asynccontextmanager``: it is entered once per request, and a
    generator-based context manager costs an async generator and the event loop's hooks for it
    each time (~3% of the client's CPU per record, benchmark (a))."""

    __slots__ = ("_budget", "_share", "_tokens", "_weight")

    def __init__(self, budget: ServerBudget, tokens: int, share: str) -> None:
        self._budget = budget
        self._tokens = tokens
        self._share = share
        self._weight: float | None = None

    async def __aenter__(self) -> None:
        self._weight = await self._budget._acquire(self._tokens, self._share)

    async def __aexit__(self, *exc_info: object) -> None:
        if self._weight is not None:
            weight, self._weight = self._weight, None
            self._budget._release(self._share, self._tokens, weight)
