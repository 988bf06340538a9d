"""Ctrl-C and SIGTERM for a run started from the command line: stop within seconds, cleanly.

A terminal's Ctrl-C sends SIGINT to its whole process group. Prefect's temporary API server
(started when ``PREFECT_API_URL`` is unset) is a child in that group, so it used to die first
and every later log and state call failed with a traceback, while the run went on. So:

- :func:`temporary_prefect_server` starts that server itself, in its own session (a group's
  SIGINT does not reach it) and with a parent-death signal (a SIGKILLed CLI does not leave it
  behind), and stops it when the command ends;
- :func:`stop_on_signals` turns the first SIGINT or SIGTERM into a cancellation of the flow's
  task: the flow's own ``finally`` blocks stop the server it launched and write the summary,
  the API is still there to record it, and the command exits 130 with one line. The launched
  SGLang server runs in its own session too (``sglang/process.py``), so only the run stops it;
- :func:`mark_cancelled` then sets the run and its unfinished subflows Cancelled (Prefect
  records a cancelled task as Crashed).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Awaitable, Iterator
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")
_PR_SET_PDEATHSIG = 1


class Interrupted(Exception):
    """The run was stopped by a signal; ``signum`` says which."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        super().__init__(f"stopped by {signal.Signals(signum).name}")


def _die_with_parent() -> None:  # pragma: no cover - runs in the child before exec
    """In the child: SIGTERM when the parent dies (Linux), whatever killed the parent."""
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def temporary_prefect_server(timeout_s: float = 180.0) -> Iterator[str | None]:
    """Without an API URL in Prefect's settings (environment or profile): Prefect's API
    server, as its temporary one would be (same database), in its own session, for the
    duration of the block; yields its API URL (None, and nothing started, when one is set).
    Either way, logs and events still queued are sent when the block ends, so that nothing
    Prefect prints at exit comes after the command's own last line."""
    import prefect
    from prefect.settings import PREFECT_API_URL, temporary_settings

    if PREFECT_API_URL.value():
        try:
            yield None
        finally:
            _drain()
        return
    port = _free_port()
    api = f"http://127.0.0.1:{port}/api"
    env = {**os.environ, "PREFECT_UI_ENABLED": "0", "PREFECT__SERVER_EPHEMERAL": "1"}
    cmd = [
        sys.executable,
        "-m",
        "uvicorn",
        "--app-dir",
        str(prefect.__module_path__.parent),
        "--factory",
        "prefect.server.api.server:create_app",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--log-level",
        "error",
        "--lifespan",
        "on",
    ]
    # Its output (and the tracebacks it logs while it stops) goes to a file, not the terminal.
    log = Path(tempfile.gettempdir()) / f"eagle3-datagen-prefect-server-{port}.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            cmd,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_die_with_parent,
        )
    try:
        _wait_health(api, proc, timeout_s, log)
        with temporary_settings({PREFECT_API_URL: api}):
            try:
                yield api
            finally:
                # While the server is there: otherwise the queues' workers retry against a
                # stopped server for a minute at exit.
                _drain()
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    log.unlink(missing_ok=True)  # kept (and named) only when it did not start


def local_database() -> Path | None:
    """The SQLite file that Prefect's temporary server uses (None when it is not SQLite)."""
    from prefect.settings import get_current_settings

    url = get_current_settings().server.database.connection_url
    text = url.get_secret_value() if url is not None else ""
    scheme, _, path = text.partition(":///")
    return Path(path) if scheme.startswith("sqlite") and path else None


def _drain() -> None:
    """Send the logs and events still queued (Prefect's background workers)."""
    from prefect._internal.concurrency.services import QueueService

    QueueService.drain_all(timeout=15)


def _wait_health(api: str, proc: subprocess.Popen[Any], timeout_s: float, log: Path) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        if proc.poll() is not None:
            raise RuntimeError(
                f"Prefect's temporary API server exited with {proc.returncode}; see {log}"
            )
        try:
            with urllib.request.urlopen(f"{api}/health", timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"Prefect's temporary API server did not start in {timeout_s} s; see {log}"
            )
        time.sleep(0.2)


async def stop_on_signals(work: Awaitable[T]) -> T:
    """Await ``work``; the first SIGINT or SIGTERM cancels it and raises :class:`Interrupted`
    once it has unwound (a second signal while it unwinds is ignored: the stop is under way)."""
    loop = asyncio.get_running_loop()
    task = asyncio.ensure_future(work)
    got: list[int] = []

    def on_signal(signum: int) -> None:
        if not got:
            got.append(signum)
            task.cancel()

    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, on_signal, signum)
    try:
        return await task
    except BaseException as err:
        if got:
            raise Interrupted(got[0]) from err
        raise
    finally:
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(signum)


async def mark_cancelled(flow_run_id: Any, why: str) -> None:
    """Set the flow run, and its subflows that did not finish, Cancelled with ``why``.

    A fan-out's partition jobs are deployment runs that workers run in their own processes:
    a running one is set Cancelling, which is what makes its worker stop the job's process
    (whose hooks stop its server) and then mark it Cancelled; Cancelled straight away would
    leave it generating on its node. One not yet running is set Cancelled."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterParentFlowRunId
    from prefect.states import Cancelled, Cancelling

    async with get_client() as client:
        subs = await client.read_flow_runs(
            flow_run_filter=FlowRunFilter(
                parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=[flow_run_id])
            )
        )
        for run in [*subs, await client.read_flow_run(flow_run_id)]:
            done = run.state is not None and run.state.is_completed()
            job = run.deployment_id is not None and run.id != flow_run_id
            if done or (job and run.state is not None and run.state.is_final()):
                continue  # a job that ended on its own keeps its own end
            # A job a worker runs is stopped through its worker; one not yet running is not
            # picked up once Cancelled.
            running = job and run.state is not None and run.state.is_running()
            state: Any = Cancelling(message=why) if running else Cancelled(message=why)
            await client.set_flow_run_state(run.id, state, force=True)
