"""A stop someone asked for, in the library: nothing the windowed gather started outlives its
cancellation; a supervisor standing down takes no failure for a lost server and relaunches
nothing; the run's Cancelled message says what had completed."""

from __future__ import annotations

import asyncio
import logging

import pytest

from eagle3_datagen.errors import ServerError
from eagle3_datagen.generate.windowed import run_windowed
from eagle3_datagen.report.outcome import RunOutcome
from eagle3_datagen.sglang.supervisor import ServerSupervisor


async def test_a_cancelled_window_ends_everything_it_started() -> None:
    started: list[int] = []
    ended: list[int] = []

    async def batch(i: int) -> int:
        started.append(i)
        try:
            await asyncio.sleep(3600)
        finally:
            ended.append(i)
        return i

    run = asyncio.create_task(run_windowed(iter(range(10)), batch, 3))
    while len(started) < 3:
        await asyncio.sleep(0)
    run.cancel()
    with pytest.raises(asyncio.CancelledError):
        await run
    # Every batch it had started has ended by the time the cancellation reaches the caller.
    assert sorted(ended) == sorted(started) == [0, 1, 2]


async def test_a_supervisor_standing_down_loses_nothing_and_relaunches_nothing() -> None:
    checks: list[float] = []
    relaunches: list[int] = []

    async def check(deadline_s: float) -> None:
        checks.append(deadline_s)
        raise ServerError("connection refused")

    async def relaunch() -> None:
        relaunches.append(1)

    sup = ServerSupervisor(
        check=check, relaunch=relaunch, logger=logging.getLogger("test"), failure_threshold=2
    )
    sup.stand_down()
    for _ in range(30):  # requests that fail while the server is stopped on purpose
        sup.on_connection_error("connection refused")
    await asyncio.sleep(0)
    assert not checks and not relaunches and not sup.lost
    await sup.before_request()  # requests are not paused either
    await sup.aclose()


async def test_a_supervisor_that_stands_down_during_a_check_relaunches_nothing() -> None:
    gate = asyncio.Event()
    relaunches: list[int] = []
    sup: ServerSupervisor

    async def check(deadline_s: float) -> None:
        await gate.wait()
        raise ServerError("connection refused")

    async def relaunch() -> None:
        relaunches.append(1)

    sup = ServerSupervisor(
        check=check, relaunch=relaunch, logger=logging.getLogger("test"), failure_threshold=1
    )
    sup.on_connection_error("connection refused")  # a recovery starts: the health gate runs
    await asyncio.sleep(0)
    sup.stand_down()  # the run ends meanwhile
    gate.set()
    for _ in range(5):
        await asyncio.sleep(0)
    assert not relaunches and not sup.lost
    await sup.aclose()


def test_the_cancelled_message_names_what_completed_and_what_a_rerun_finishes() -> None:
    outcome = RunOutcome(["demo_short", "demo_long", "demo_images"])
    outcome.started()
    outcome.partition_completed("demo_short", {"accepted": 64})
    outcome.partition_completed("demo_images", {"accepted": 8})
    outcome.stopped(asyncio.CancelledError(), cancelled=True)
    assert outcome.cancelled_message() == (
        "stopped before it finished: 2 of 3 partitions completed (demo_short, demo_images); "
        "a rerun finishes demo_long"
    )
    assert outcome.final_states() == {
        "demo_short": "completed",
        "demo_long": "cancelled",
        "demo_images": "completed",
    }
    assert outcome.failure() is not None  # the run's reason, were it not returned Cancelled
