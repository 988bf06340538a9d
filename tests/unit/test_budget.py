"""The server budget's admission order, on one event loop with no I/O.

``await asyncio.sleep(0.01)`` here is not a wait for something outside: it hands the loop a turn
so every task that can move does (tasks woken by a release or a new limit run before the sleep
returns), and the assertions after it are on what the budget let through, including what it must
not have let through, which no condition can be waited for.
"""

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
    tasks = [
        asyncio.create_task(hold(budget, t, log, n, gate))
        for n, t in [("a", 40), ("b", 40), ("big", 90), ("c", 10), ("d", 10)]
    ]
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


async def test_the_ceiling_holds_over_the_adaptive_limit() -> None:
    """server.limits.max_requests_in_flight is a ceiling: the controller's limit never lifts it."""
    budget = ServerBudget(max_requests=3, adaptive=["auto"])
    budget.set_adaptive_limit(10)
    assert budget.adaptive_limit == 3
    gate = asyncio.Event()
    log: list[str] = []

    async def one(i: int) -> None:
        async with budget.reserve(1, "auto"):
            log.append(str(i))
            await gate.wait()

    tasks = [asyncio.create_task(one(i)) for i in range(6)]
    await asyncio.sleep(0.01)
    assert budget.requests == 3 and len(log) == 3
    gate.set()
    await asyncio.gather(*tasks)
    assert budget.peak_requests == 3


async def test_static_shares_keep_their_numbers_past_the_adaptive_limit() -> None:
    """The adaptive limit counts every request in flight but holds back only auto shares."""
    budget = ServerBudget(adaptive=["auto"])
    budget.set_adaptive_limit(4)
    gate = asyncio.Event()
    got: dict[str, int] = {"auto": 0, "static": 0}

    async def one(share: str) -> None:
        async with budget.reserve(1, share):
            got[share] += 1
            await gate.wait()

    tasks = [asyncio.create_task(one("auto")) for _ in range(10)]
    await asyncio.sleep(0.01)
    assert got["auto"] == 4
    tasks += [asyncio.create_task(one("static")) for _ in range(6)]
    await asyncio.sleep(0.01)
    assert got == {"auto": 4, "static": 6}  # none of the static requests waits
    budget.set_adaptive_limit(12)  # counts all 10 in flight: room for 2 more auto
    await asyncio.sleep(0.01)
    assert got == {"auto": 6, "static": 6}
    gate.set()
    await asyncio.gather(*tasks)


async def test_places_follow_kv_tokens_not_request_counts() -> None:
    """A LONG share whose requests reserve 16x a SHORT one's gets about a sixteenth of the
    places; once SHORT's requests are seen to use a quarter of their reservation, SHORT's
    weigh a quarter and it gets four times the places again."""
    budget = ServerBudget(max_requests=17)
    gate = asyncio.Event()

    async def one(share: str, tokens: int) -> None:
        async with budget.reserve(tokens, share):
            await gate.wait()

    budget.set_max_requests(0)  # everyone queues first
    tasks = [asyncio.create_task(one("LONG", 16_000)) for _ in range(40)]
    tasks += [asyncio.create_task(one("SHORT", 1_000)) for _ in range(40)]
    await asyncio.sleep(0.01)
    budget.set_max_requests(17)
    await asyncio.sleep(0.01)
    assert budget.by_share == {"LONG": 1, "SHORT": 16}
    gate.set()
    await asyncio.gather(*tasks)

    for _ in range(200):  # SHORT's requests hold 250 of the 1000 tokens they reserve
        budget.observe("SHORT", 1_000, 250)
    assert abs(budget.fill["SHORT"] - 0.25) < 0.01
    gate.clear()
    budget.set_max_requests(0)
    tasks = [asyncio.create_task(one("LONG", 16_000)) for _ in range(40)]
    tasks += [asyncio.create_task(one("SHORT", 1_000)) for _ in range(80)]
    await asyncio.sleep(0.01)
    budget.set_max_requests(65)
    await asyncio.sleep(0.01)
    assert budget.by_share == {"LONG": 1, "SHORT": 64}
    gate.set()
    await asyncio.gather(*tasks)


async def test_longest_first_gives_places_to_the_longest_share_first() -> None:
    """Longest first (a run with auto tiers): a freed place goes to the share whose head is
    expected to hold the most KV tokens; the tier that is left takes the places the others no
    longer need; within a share the order stays FIFO. The fair order would have started
    SHORT's requests first (they arrived first) and given LONG one place in 17."""
    budget = ServerBudget(adaptive=["SHORT", "LONG"], longest_first=True)
    budget.set_adaptive_limit(0)  # everyone queues first
    gate = asyncio.Event()
    started: list[tuple[str, int]] = []

    async def one(share: str, tokens: int) -> None:
        async with budget.reserve(tokens, share):
            started.append((share, tokens))
            await gate.wait()

    short = [1_000 + p for p in (10, 300, 20, 200)]  # max_tokens 1,000 + prompt lengths
    long = [16_000 + p for p in (50, 900, 400)]
    tasks = [asyncio.create_task(one("SHORT", t)) for t in short]
    await asyncio.sleep(0.01)
    tasks += [asyncio.create_task(one("LONG", t)) for t in long]
    await asyncio.sleep(0.01)
    budget.set_adaptive_limit(5)
    await asyncio.sleep(0.01)
    assert started == [
        ("LONG", 16_050),
        ("LONG", 16_900),
        ("LONG", 16_400),
        ("SHORT", 1_010),
        ("SHORT", 1_300),
    ]
    gate.set()
    await asyncio.gather(*tasks)
    assert started[5:] == [("SHORT", 1_020), ("SHORT", 1_200)]
    assert budget.requests == 0 and budget.waiting == 0


async def test_longest_first_weighs_a_share_by_what_its_requests_really_hold() -> None:
    """A share whose outputs stop far short of max_tokens (observed fill) is expected to run
    shorter than its reservation says: a share that fills more of less goes first."""
    budget = ServerBudget(max_requests=1, longest_first=True)
    for _ in range(200):  # BIG's requests hold a tenth of the 10,000 tokens they reserve
        budget.observe("BIG", 10_000, 1_000)
    gate = asyncio.Event()
    started: list[str] = []

    async def one(share: str, tokens: int) -> None:
        async with budget.reserve(tokens, share):
            started.append(share)
            await gate.wait()

    budget.set_max_requests(0)
    tasks = [asyncio.create_task(one("BIG", 10_000)), asyncio.create_task(one("MID", 3_000))]
    await asyncio.sleep(0.01)
    budget.set_max_requests(1)
    await asyncio.sleep(0.01)
    assert started == ["MID"]  # expected 3,000 held against BIG's ~1,000
    gate.set()
    await asyncio.gather(*tasks)
    assert started == ["MID", "BIG"]
