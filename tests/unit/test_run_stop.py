"""The run's one stop object: the first request stops, records when and by what, and cancels
the task it was given; a later one changes nothing; the flows read the bound one."""

from __future__ import annotations

import asyncio
import signal
from datetime import UTC, datetime, timedelta

import pytest

from eagle3_datagen.stop import RunStop, current_stop


async def test_the_first_request_cancels_the_attached_task_once() -> None:
    told: list[int] = []
    stop = RunStop(on_stop=told.append)
    work = asyncio.create_task(asyncio.sleep(3600))
    stop.attach(work)
    stop.attach(asyncio.create_task(asyncio.sleep(0)))  # a later body: the first one stays
    assert stop.request(signal.SIGTERM) is True
    assert stop.request(signal.SIGINT) is False  # a second signal while it unwinds
    with pytest.raises(asyncio.CancelledError):
        await work
    assert stop.signum == signal.SIGTERM and told == [signal.SIGTERM] and stop.requested


def test_what_ended_after_the_stop_began_ended_because_of_it() -> None:
    stop = RunStop()
    assert not stop.began_before(datetime.now(UTC))  # no stop: nothing is its doing
    stop.request()
    assert stop.at is not None
    assert stop.began_before(stop.at + timedelta(milliseconds=1))
    assert not stop.began_before(stop.at - timedelta(seconds=1))


async def test_the_bound_stop_reaches_the_tasks_started_under_it() -> None:
    stop = RunStop()
    assert current_stop() is None
    with stop.bound():
        seen = await asyncio.create_task(asyncio.to_thread(current_stop))
        inner = await asyncio.create_task(_current())
    assert seen is stop and inner is stop and current_stop() is None
    stop.note_run("parent")
    stop.note_run("subflow")  # the outermost run is the first noted
    assert stop.run_id == "parent"


async def _current() -> RunStop | None:
    return current_stop()
