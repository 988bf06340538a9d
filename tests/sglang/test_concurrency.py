"""concurrency: auto. The controller's rules on readings, its reading of a real emulator's
/metrics, where it reads the load from when /metrics is not SGLang's (a router's front), the
user's ceiling, the table of its changes, and the budget's fair places across partitions."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

from eagle3_datagen.config import AutoConcurrency, RetryPolicy
from eagle3_datagen.sglang.budget import ServerBudget
from eagle3_datagen.sglang.client import SGLangClient
from eagle3_datagen.sglang.concurrency import ConcurrencyController
from eagle3_datagen.sglang.load import LOADS, METRICS, RESPONSES, LoadReader, LoadSample
from eagle3_datagen.sglang.requests import generate_with_retries
from tests.support.emulator import KV_POOR_RETRACTING, SEED_NODE_WITH_METRICS, EmulatorProcess
from tests.support.front import FrontProcess


def _sample(running: int, queued: int = 0, usage: float = 0.5, retracted: int = 0) -> LoadSample:
    return LoadSample(running, queued, usage, 1000.0, retracted)


def test_rules_grow_trim_and_back_off_once_per_cut() -> None:
    c = ConcurrencyController(ServerBudget(), LoadReader(["http://x"]), AutoConcurrency(initial=16))
    assert c.decide(_sample(16, usage=0.2), in_flight=16)[0] == 32  # slow start doubles
    c.limit = 100
    # Prefill backlog (a short-lived queue) neither grows nor trims.
    assert c.decide(_sample(60, queued=40), in_flight=100)[0] == 100
    assert c.decide(_sample(60, queued=40), in_flight=100)[0] == 100
    # The third reading in a row with a long queue trims (by at most 10%).
    assert c.decide(_sample(60, queued=40), in_flight=100)[0] == 90
    c.limit = 90
    # Retractions: back off to 85% of what the server holds ...
    assert c.decide(_sample(80, retracted=5), in_flight=80)[0] == 68
    c.limit = 68
    # ... once: while more are still in flight than the cut allows, more retractions wait.
    assert c.decide(_sample(80, retracted=9), in_flight=80)[0] == 68


def test_retractions_leave_a_ceiling_growth_stops_below() -> None:
    """Growing back into retractions cost more than it made (figure (e) reasoning: 66-113
    retractions, 0.962x the best static): after a back-off the limit grows again only to 90% of
    what was in flight when they were seen, and that ceiling rises (5%) only after two
    ceilings' worth of requests finished without a retraction."""
    budget = ServerBudget()
    c = ConcurrencyController(budget, LoadReader(["http://x"]), AutoConcurrency(initial=100))
    c.slow_start = False

    def read(s: LoadSample) -> tuple[int, str]:  # a reading with the limit all in flight
        c.limit, reason = c.decide(s, in_flight=c.limit)
        return c.limit, reason

    assert read(_sample(100))[0] == 105  # grows 5%
    # 6 retracted with 105 in flight, 99 left running: back off to 85% of those, and make
    # 90% of the 105 a ceiling.
    assert read(_sample(99, retracted=6))[0] == int(99 * 0.85) == 84
    assert c.cap == int(105 * 0.9) == 94
    # KV pool half used, nothing queued: the old rule grew 5% a reading after two of hold.
    limits = [read(_sample(c.limit, retracted=6)) for _ in range(30)]
    assert max(limit for limit, _ in limits) == 94
    assert limits[-1] == (94, "at the retraction ceiling 94")

    async def finish(n: int) -> None:  # requests through the real budget
        for _ in range(n):
            async with budget.reserve(0, "p"):
                pass  # a place reserved and given back: one request finished

    asyncio.run(finish(2 * 94 - 1))
    assert read(_sample(94, retracted=6))[0] == 94
    asyncio.run(finish(1))  # two ceilings' worth finished without a retraction: it rises 5%
    assert read(_sample(94, retracted=6))[0] == c.cap == 99
    assert read(_sample(99, retracted=6))[0] == 99
    # A lone retraction backs off but leaves the ceiling where it was.
    assert read(_sample(99, retracted=7)) == (84, "1 retracted at 99 in flight: back off")
    assert c.cap == 99


def test_slow_start_stops_doubling_once_twice_the_kv_in_use_would_not_fit() -> None:
    """Running requests' KV grows as they decode, long after the limit moved: doubling at 74%
    used (figure (e) reasoning, 256 -> 512) retracted 110 at once and left 400 in flight."""
    c = ConcurrencyController(ServerBudget(), LoadReader(["http://x"]), AutoConcurrency())
    assert c.decide(_sample(64, usage=0.2), in_flight=64)[0] == 128  # doubles
    c.limit = 128
    assert c.decide(_sample(128, usage=0.46), in_flight=128) == (135, "grow")  # 5% from here
    assert not c.slow_start


def test_on_long_outputs_slow_start_stops_before_the_pool_fills(
    emulator_factory: Callable[..., EmulatorProcess],
) -> None:
    """The reasoning profile (mean 8,000 output tokens) read from a real emulator's /metrics:
    slow start doubles only at readings with less than 46% of the pool used, and so never
    reaches 512 in flight (before, it doubled 256 -> 512 at 74% used and retracted 110)."""
    emu = emulator_factory(
        "--emu-physics", "reasoning", "--emu-time-scale", "0.0015", "--enable-metrics"
    ).wait_ready()

    async def go() -> ConcurrencyController:
        budget = ServerBudget()
        # A reading every 0.2 s (~130 simulated s): at 0.02 s a doubling could come before the
        # last one's requests showed in the pool, and 256 -> 512 passed at a reading under 46%
        # in 2 of 6 runs. At 0.2 s: 13 of 13 runs pass, and 4 of 4 fail without the rule.
        ac = AutoConcurrency(interval_s=0.2)
        c = ConcurrencyController(budget, LoadReader([emu.url]), ac)
        policy = RetryPolicy(max_attempts=1, backoff_initial_s=0.1, backoff_max_s=0.2)
        async with SGLangClient(emu.url, max_connections=1100) as client:
            tasks = [
                asyncio.create_task(
                    generate_with_retries(
                        client,
                        [5, 6, 7, 8] * 250,
                        {"max_new_tokens": 16384},
                        rid=f"r-{i}",
                        policy=policy,
                        budget=budget,
                        share="p",
                    )
                )
                for i in range(1000)
            ]
            await asyncio.sleep(2.0)  # ~1,300 simulated seconds: the pool fills
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await c.aclose()
        return c

    c = asyncio.run(go())
    assert max(d.limit for d in c.history) < 512, c.changes
    doublings = [d for d in c.history if d.reason == "slow start"]
    assert doublings and all(d.sample.token_usage < 0.46 for d in doublings), c.changes
    assert max(d.sample.token_usage for d in c.history) > 0.46  # the pool did fill


def test_a_full_pool_with_nothing_waiting_still_grows_until_a_request_is_at_hand() -> None:
    c = ConcurrencyController(ServerBudget(), LoadReader(["http://x"]), AutoConcurrency())
    c.limit, c.slow_start = 40, False
    full = 0.95  # over USAGE_HIGH: the pool is full
    # Nothing waiting on the server: a finishing request leaves its place idle until the
    # client's next one arrives, so one more in flight (5%) is offered.
    assert c.decide(_sample(40, queued=0, usage=full), in_flight=40)[0] == 42
    # Two waiting: the next request is at hand; a full pool takes no more.
    assert c.decide(_sample(40, queued=2, usage=full), in_flight=42)[0] == 40


async def _drive(url: str, budget: ServerBudget, n: int, share: str = "p") -> None:
    policy = RetryPolicy(max_attempts=2, backoff_initial_s=0.1, backoff_max_s=0.2)
    async with SGLangClient(url, max_connections=600) as client:
        await asyncio.gather(
            *(
                generate_with_retries(
                    client,
                    [5, 6, 7] * 100,
                    {"max_new_tokens": 300},
                    rid=f"{share}-{i}",
                    policy=policy,
                    budget=budget,
                    share=share,
                )
                for i in range(n)
            )
        )


def test_controller_reads_a_real_server_and_grows_to_its_load(
    emulator_factory: Callable[..., EmulatorProcess],
) -> None:
    emu = emulator_factory(
        *SEED_NODE_WITH_METRICS,
    ).wait_ready()

    async def go() -> ConcurrencyController:
        budget = ServerBudget()
        settings = AutoConcurrency(initial=4, interval_s=0.05)
        c = ConcurrencyController(budget, LoadReader([emu.url]), settings)
        try:
            await _drive(emu.url, budget, 300)
        finally:
            await c.aclose()
        return c

    c = asyncio.run(go())
    assert c.errors == 0
    readings = [d.sample for d in c.history]
    assert readings and max(s.running for s in readings) > 4
    assert max(d.limit for d in c.history) >= 16  # slow start from 4
    assert all(0.0 <= s.token_usage <= 1.0 for s in readings)
    assert any(s.gen_throughput > 0 for s in readings)


def test_budget_gives_partitions_equal_places() -> None:
    async def go() -> list[str]:
        budget = ServerBudget(max_requests=4)
        order: list[str] = []
        gate = asyncio.Event()

        async def hold(share: str) -> None:
            async with budget.reserve(1, share):
                order.append(share)
                await gate.wait()

        # Partition A queues 20 requests before B queues 4.
        tasks = [asyncio.create_task(hold("A")) for _ in range(20)]
        await asyncio.sleep(0)
        tasks += [asyncio.create_task(hold("B")) for _ in range(4)]
        await asyncio.sleep(0.01)
        assert order == ["A"] * 4
        budget.set_max_requests(8)  # the controller raises the limit
        await asyncio.sleep(0.01)
        gate.set()
        await asyncio.gather(*tasks)
        return order

    order = asyncio.run(go())
    # The four new places go to B (fewest in flight), not to A's older waiters.
    assert order[4:8] == ["B"] * 4


def test_without_metrics_retractions_in_responses_make_it_back_off(
    emulator_factory: Callable[..., EmulatorProcess],
) -> None:
    """A server without /metrics: meta_info.num_retractions of finished requests is the signal."""
    emu = emulator_factory(
        *KV_POOR_RETRACTING,
    ).wait_ready()
    budget = ServerBudget()
    policy = RetryPolicy(max_attempts=2, backoff_initial_s=0.1, backoff_max_s=0.2)

    async def go() -> list[int]:
        async with SGLangClient(emu.url) as client:
            results = await asyncio.gather(
                *(
                    generate_with_retries(
                        client,
                        [5, 6, 7] * 70,
                        {"max_new_tokens": 4000},
                        rid=f"r-{i}",
                        policy=policy,
                        budget=budget,
                        share="p",
                    )
                    for i in range(20)
                )
            )
        return [r.num_retractions for r in results]

    retractions = asyncio.run(go())
    assert sum(retractions) > 0 and budget.retractions_reported == sum(retractions)
    c = ConcurrencyController(budget, LoadReader([emu.url]), AutoConcurrency(initial=16))
    no_counter = LoadSample(16, 0, 0.5, 1000.0, None)
    c._last_retracted = 0  # the reading before the retractions came back
    limit, reason = c.decide(no_counter, in_flight=16)
    assert limit < 16 and "retracted at 16 in flight: back off" in reason


def test_the_users_ceiling_is_never_exceeded() -> None:
    """server.max_requests_in_flight caps the controller: its start, its growth, the budget."""
    budget = ServerBudget(max_requests=24, adaptive=["p"])
    c = ConcurrencyController(
        budget, LoadReader(["http://x"]), AutoConcurrency(initial=64), ceiling=24
    )
    assert c.limit == 24 and budget.adaptive_limit == 24 and budget.max_requests == 24
    for _ in range(5):
        c.apply(_sample(24, usage=0.1))
    assert max(d.limit for d in c.history) == 24
    assert budget.max_requests == 24  # the user's number is never overwritten


def _run_auto(url: str, n: int, **controller: Any) -> ConcurrencyController:
    async def go() -> ConcurrencyController:
        budget = ServerBudget(adaptive=["p"])
        settings = AutoConcurrency(initial=4, interval_s=0.05)
        c = ConcurrencyController(budget, LoadReader([url]), settings, **controller)
        try:
            await _drive(url, budget, n)
        finally:
            await c.aclose()
        return c

    return asyncio.run(go())


def test_a_routers_metrics_are_detected_and_the_responses_steer(
    emulator_factory: Callable[..., EmulatorProcess], tmp_path: Path
) -> None:
    """Behind a front whose /metrics is a router's and whose /v1/loads is 404, the controller
    says so once at the start and steers on the responses: it still grows (no freeze)."""
    emus = [emulator_factory(*SEED_NODE_WITH_METRICS) for _ in range(2)]
    for emu in emus:
        emu.wait_ready()
    warned: list[str] = []
    rows: list[dict[str, Any]] = []
    with FrontProcess([e.url for e in emus], tmp_path / "front.log") as front:
        c = _run_auto(front.url, 300, warn=warned.append, on_change=rows.append)
    assert c.reader.source == {front.url: RESPONSES}
    assert len(warned) == 1, warned
    assert "a router's (sglang-router: sgl_router_*)" in warned[0]
    assert f"{front.url}/v1/loads is not SGLang's" in warned[0]
    assert c.errors == 0
    assert {d.source for d in c.history} == {RESPONSES}
    assert max(d.limit for d in c.history) >= 16  # slow start from 4, on in-flight alone
    assert rows and rows == c.changes
    assert set(rows[0]) == {
        "time",
        "limit",
        "previous",
        "in_flight",
        "running",
        "queued",
        "token_usage",
        "retractions",
        "source",
        "reason",
    }
    assert rows[0]["previous"] == 4 and rows[0]["reason"] == "slow start"


def test_without_metrics_the_loads_endpoint_is_read(
    emulator_factory: Callable[..., EmulatorProcess],
) -> None:
    """A server launched without --enable-metrics: /metrics is 404, /v1/loads is read."""
    emu = emulator_factory(
        "--emu-physics", "seed-node", "--emu-time-scale", "0.01", "--emu-mean-output-tokens", "300"
    ).wait_ready()
    warned: list[str] = []
    c = _run_auto(emu.url, 200, warn=warned.append)
    assert c.reader.source == {emu.url: LOADS}
    assert len(warned) == 1 and "answers HTTP 404 (no --enable-metrics)" in warned[0]
    assert any(d.sample.running > 0 for d in c.history)
    assert {d.source for d in c.history} == {LOADS}


def test_sglang_metrics_need_no_warning(emulator_factory: Callable[..., EmulatorProcess]) -> None:
    emu = emulator_factory(
        *SEED_NODE_WITH_METRICS,
    ).wait_ready()
    warned: list[str] = []
    c = _run_auto(emu.url, 100, warn=warned.append)
    assert c.reader.source == {emu.url: METRICS} and not warned
