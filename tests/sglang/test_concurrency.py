"""concurrency: auto. The controller's rules on readings, its reading of a real emulator's
/metrics, and the budget's fair places across partitions."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from eagle3_datagen.config import AutoConcurrency, RetryPolicy
from eagle3_datagen.sglang.budget import ServerBudget
from eagle3_datagen.sglang.client import SGLangClient
from eagle3_datagen.sglang.concurrency import ConcurrencyController
from eagle3_datagen.sglang.load import LoadReader, LoadSample
from eagle3_datagen.sglang.requests import generate_with_retries
from tests.support.emulator import EmulatorProcess


def _sample(running: int, queued: int = 0, usage: float = 0.5, retracted: int = 0) -> LoadSample:
    return LoadSample(running, queued, usage, 1000.0, retracted)


def test_rules_grow_trim_and_back_off_once_per_cut() -> None:
    c = ConcurrencyController(ServerBudget(), LoadReader(["http://x"]), AutoConcurrency(initial=16))
    assert c.decide(_sample(16, retracted=0), in_flight=16)[0] == 32  # slow start doubles
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


async def _drive(url: str, budget: ServerBudget, n: int, share: str = "p") -> None:
    policy = RetryPolicy(max_attempts=2, backoff_initial_s=0.1, backoff_max_s=0.2)
    async with SGLangClient(url, max_connections=600) as client:
        await asyncio.gather(*(
            generate_with_retries(client, [5, 6, 7] * 100, {"max_new_tokens": 300},
                                  rid=f"{share}-{i}", policy=policy, budget=budget, share=share)
            for i in range(n)
        ))  # fmt: skip


def test_controller_reads_a_real_server_and_grows_to_its_load(
    emulator_factory: Callable[..., EmulatorProcess],
) -> None:
    emu = emulator_factory(
        "--emu-physics", "seed-node", "--emu-time-scale", "0.01", "--enable-metrics",
        "--emu-mean-output-tokens", "300",
    ).wait_ready()  # fmt: skip

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
        "--emu-physics", "kv-poor", "--emu-time-scale", "0.001", "--emu-max-total-tokens",
        "20000", "--emu-mean-output-tokens", "3000", "--emu-output-sigma", "0.2",
    ).wait_ready()  # fmt: skip
    budget = ServerBudget()
    policy = RetryPolicy(max_attempts=2, backoff_initial_s=0.1, backoff_max_s=0.2)

    async def go() -> list[int]:
        async with SGLangClient(emu.url) as client:
            results = await asyncio.gather(*(
                generate_with_retries(client, [5, 6, 7] * 70, {"max_new_tokens": 4000},
                                      rid=f"r-{i}", policy=policy, budget=budget, share="p")
                for i in range(20)
            ))  # fmt: skip
        return [r.num_retractions for r in results]

    retractions = asyncio.run(go())
    assert sum(retractions) > 0 and budget.retractions_reported == sum(retractions)
    c = ConcurrencyController(budget, LoadReader([emu.url]), AutoConcurrency(initial=16))
    no_counter = LoadSample(16, 0, 0.5, 1000.0, None)
    c._last_retracted = 0  # the reading before the retractions came back
    limit, reason = c.decide(no_counter, in_flight=16)
    assert limit < 16 and "retracted: back off" in reason
