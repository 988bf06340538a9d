"""The Prefect names the command line's temporary-server code relies on, checked against the
installed Prefect: its drain of queued logs and events (``prefect_server.drain``) uses the
public worker classes' ``drain_all``, which Prefect inherits from an internal base class, so
an upgrade that moves it fails here rather than at the end of every run."""

from __future__ import annotations

import inspect
import os
import subprocess
import sys
import textwrap

import pytest
from prefect.events.worker import EventsWorker
from prefect.logging.handlers import APILogWorker

from tests.support import REPO


@pytest.mark.parametrize("worker", [APILogWorker, EventsWorker])
def test_prefects_workers_still_drain_with_a_timeout(worker):
    assert "timeout" in inspect.signature(worker.drain_all).parameters


_EMIT_THEN = textwrap.dedent(
    """
    import asyncio
    import sys

    from prefect.events import emit_event
    from prefect.events.clients import AssertingEventsClient
    from prefect.events.worker import EventsWorker

    from eagle3_datagen_cli.prefect_server import drain

    # Prefect's own recording events client, sending each event 3 s late.
    sends = AssertingEventsClient._emit

    async def late(self, event):
        await asyncio.sleep(3)
        await sends(self, event)

    AssertingEventsClient._emit = late
    EventsWorker.set_client_override(AssertingEventsClient)
    emit_event(event="eagle3-datagen.test.drained", resource={"prefect.resource.id": "x"})
    if sys.argv[1] == "drain":
        drain()
    print([e.event for e in getattr(AssertingEventsClient.last, "events", [])])
    """
)


@pytest.mark.parametrize("then", ["drain", "exit"])
def test_drain_sends_an_event_still_queued(then):
    """An event still being sent is sent by the time ``drain`` returns (and, the control, not
    yet without it). In a child process: the events client override is Prefect's global
    state; the API URL is only there so that Prefect starts no server of its own (the recording
    client never connects)."""
    env = {**os.environ, "PREFECT_API_URL": "http://127.0.0.1:9/api"}
    out = subprocess.run(
        [sys.executable, "-c", _EMIT_THEN, then],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    sent = out.stdout.strip().splitlines()[-1]
    assert sent == ("['eagle3-datagen.test.drained']" if then == "drain" else "[]"), out.stdout
