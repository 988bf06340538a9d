"""A bounded, lazy gather: at most ``window`` awaitables running, results in input order."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterator
from typing import TypeVar

T = TypeVar("T")
R = TypeVar("R")


async def run_windowed(
    items: Iterator[T], fn: Callable[[T], Awaitable[R]], window: int
) -> list[R | BaseException]:
    """Await ``fn(item)`` for every item with at most ``window`` running at once.

    Items are pulled lazily (the input is never materialised); a failure does not stop the
    others, and results come back in input order, exceptions in place of failed results.
    Cancelled, it cancels what is running and returns only once all of it has ended: nothing
    it started outlives it (a batch still sending to a server being stopped reads as a lost
    server, and one still reporting after its client closed fails).
    """
    results: dict[int, R | BaseException] = {}
    running: set[asyncio.Task[None]] = set()

    async def one(i: int, item: T) -> None:
        try:
            results[i] = await fn(item)
        except Exception as err:
            results[i] = err

    try:
        for i, item in enumerate(items):
            if len(running) >= window:
                _, running = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
            running.add(asyncio.create_task(one(i, item)))
        if running:
            await asyncio.wait(running)
    except asyncio.CancelledError:
        for task in running:
            task.cancel()
        await asyncio.gather(*running, return_exceptions=True)
        raise
    return [results[i] for i in range(len(results))]
