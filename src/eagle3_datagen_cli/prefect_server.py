"""The Prefect API a command talks to: ``PREFECT_API_URL``'s, or else a temporary server that
this command starts itself.

A terminal's Ctrl-C sends SIGINT to its whole process group. Prefect's own temporary API server
(started when ``PREFECT_API_URL`` is unset) is a child in that group, so it used to die first
and every later log and state call failed with a traceback, while the run went on. So
:func:`temporary_prefect_server` starts that server itself, in its own session (a group's
SIGINT does not reach it) and with a parent-death signal (a SIGKILLed command does not leave it
behind), and stops it when the command ends; ``signals.py`` does the stopping of the run.

Its first start on a new Prefect home creates and migrates the SQLite database; each start
holds ``prefect_home.first_start_lock`` until its server answers, so two commands started at
once do not both migrate it.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from eagle3_datagen.errors import ConfigError
from eagle3_datagen.processes import free_port
from eagle3_datagen_cli.prefect_home import first_start_lock, glance_local_database

_PR_SET_PDEATHSIG = 1


def prefect_env() -> None:
    """The Prefect settings a command-line run needs, unless the environment says otherwise."""
    # Telemetry writes race the embedded SQLite database ("database is locked").
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("PREFECT_LOGGING_EXTRA_LOGGERS", "eagle3_datagen")
    # The embedded backend migrates a new SQLite database on first start: ~20 s on 2 cores.
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")


class _NoTemporaryLinks(logging.Filter):
    """Drops Prefect's "View at http://127.0.0.1:..." lines: they point at this command's
    temporary server, which serves no UI and is gone when the command ends."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("View at ")


def _die_with_parent() -> None:  # pragma: no cover - runs in the child before exec
    """In the child: SIGTERM when the parent dies (Linux), whatever killed the parent."""
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


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
            drain()
        return
    port = free_port()
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
    links = _NoTemporaryLinks()
    loggers = [logging.getLogger(name) for name in ("prefect.engine", "prefect.flow_runs")]
    with first_start_lock(local_database()), log.open("wb") as out:
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
        except BaseException:
            _stop(proc)
            raise
    try:
        for logger in loggers:
            logger.addFilter(links)
        with temporary_settings({PREFECT_API_URL: api}):
            try:
                yield api
            finally:
                # While the server is there: otherwise the queues' workers retry against a
                # stopped server for a minute at exit.
                drain()
    finally:
        for logger in loggers:
            logger.removeFilter(links)
        _stop(proc)
    log.unlink(missing_ok=True)  # kept (and named) only when it did not start


def _stop(proc: subprocess.Popen[Any]) -> None:
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def local_database() -> Path | None:
    """The SQLite file that Prefect's temporary server uses (None when it is not SQLite)."""
    from prefect.settings import get_current_settings

    url = get_current_settings().server.database.connection_url
    text = url.get_secret_value() if url is not None else ""
    scheme, _, path = text.partition(":///")
    return Path(path) if scheme.startswith("sqlite") and path else None


def drain() -> None:
    """Send the logs and events still queued: stop Prefect's log and event workers (they start
    again when next needed), waiting up to 15 s each. Their public classes, not the internal
    queue service base they share (tests/unit/test_prefect_server.py checks this holds)."""
    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogWorker

    for worker in (APILogWorker, EventsWorker):
        worker.drain_all(timeout=15)


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


@contextlib.contextmanager
def prefect_api() -> Iterator[str]:
    """The Prefect API a command reads: PREFECT_API_URL's, or else Prefect's local database
    (where runs started without PREFECT_API_URL are) through the temporary server; yields what
    to call it. An API that cannot be reached, or no local database, is one line. Where the
    environment alone tells which, that line (or the wait) comes before Prefect's import."""
    prefect_env()
    glanced = glance_local_database()
    if glanced is not None:
        _say_local(glanced)
    import httpx
    from prefect.settings import PREFECT_API_URL

    url = PREFECT_API_URL.value()
    where = f"the Prefect API at {url}"
    if not url:
        database = local_database()
        if glanced is None:
            _say_local(database)
        where = _local_where(database)
    try:
        with temporary_prefect_server():
            yield where
    except httpx.TransportError as err:
        raise ConfigError(
            f"cannot reach {where}: {err or type(err).__name__}; is the server running?"
        ) from None


def _local_where(database: Path | None) -> str:
    named = f"local database {database}" if database else "database in its settings"
    return f"Prefect's {named} (PREFECT_API_URL is not set)"


def _say_local(database: Path | None) -> None:
    """Nothing to read (one line), or the wait for the temporary server said before it."""
    if database is not None and not database.exists():
        raise ConfigError(
            f"nothing to read: PREFECT_API_URL is not set and Prefect's local database "
            f"{database} does not exist (no run without PREFECT_API_URL was made here)"
        )
    # It is read through Prefect's server (one in this process starts no faster: most of
    # the time is the server's own start): say why the answer takes a while.
    print(
        f"eagle3-datagen: using {_local_where(database)} through Prefect's temporary server, "
        "which takes 15-60 s to start; with PREFECT_API_URL set to a running server it is at "
        "once",
        file=sys.stderr,
        flush=True,
    )
