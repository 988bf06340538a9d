import asyncio

import pytest

from eagle3_datagen.sglang.budget import ServerBudget


async def hold(
    budget: ServerBudget, tokens: int, log: list[str], name: str, gate: asyncio.Event
) -> None:
    async with budget.reserve(tokens):
        log.append(name)
        await gate.wait()


async def test_limits_requests_and_tokens_in_fifo_order() -> None:
    budget = ServerBudget(max_requests=3, max_tokens=100)
    log: list[str] = []
    gate = asyncio.Event()
    tasks = [asyncio.create_task(hold(budget, t, log, n, gate))
             for n, t in [("a", 40), ("b", 40), ("big", 90), ("c", 10), ("d", 10)]]  # fmt: skip
    await asyncio.sleep(0.01)
    # "big" does not fit next to a+b, and the small ones queue behind it (no starvation).
    assert log == ["a", "b"] and budget.tokens == 80
    gate.set()
    await asyncio.gather(*tasks)
    assert log == ["a", "b", "big", "c", "d"]
    assert budget.requests == 0 and budget.tokens == 0
    assert budget.peak_tokens <= 100 and budget.peak_requests <= 3


async def test_request_cap_alone() -> None:
    budget = ServerBudget(max_requests=2)
    running = 0
    peak = 0

    async def one() -> None:
        nonlocal running, peak
        async with budget.reserve(1000):
            running += 1
            peak = max(peak, running)
            await asyncio.sleep(0.001)
            running -= 1

    await asyncio.gather(*(one() for _ in range(20)))
    assert peak == 2


async def test_cancelled_waiter_leaves_no_reservation() -> None:
    budget = ServerBudget(max_requests=1)
    gate = asyncio.Event()
    log: list[str] = []
    first = asyncio.create_task(hold(budget, 1, log, "first", gate))
    await asyncio.sleep(0)
    waiter = asyncio.create_task(hold(budget, 1, log, "waiter", gate))
    await asyncio.sleep(0.01)
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    gate.set()
    await first
    assert budget.requests == 0 and log == ["first"]
