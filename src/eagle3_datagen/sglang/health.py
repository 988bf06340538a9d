"""Wait for a starting SGLang server to become usable, and say why when it does not.

A 1T-parameter model loads for tens of minutes, so the gate must (a) tell the user what the
server is doing (the last log line: usually the checkpoint-shard progress bar), and (b) fail
at once, with the log tail, when the server process dies instead of waiting out the deadline.
(c) An attached server must already listen: SGLang accepts connections only once its weights
are loaded, and then answers 503 until it is warm, so a connection refused for more than a few
seconds means a wrong URL or a server that is not there, not one that is starting: the gate
says so instead of waiting out ``startup_timeout_s`` (an hour in the shipped configs).
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Protocol
from urllib.parse import urlsplit

from eagle3_datagen.errors import ServerStartupError
from eagle3_datagen.sglang.client import SGLangClient
from eagle3_datagen.sglang.process import ServerProcess
from eagle3_datagen.sglang.redact import redact_text

READY_PATH = "/health_generate"
LOG_TAIL_LINES = 50
_TAIL_BYTES = 256 * 1024
# How long an attached server may refuse connections before the gate gives up on it.
ATTACH_REFUSED_S = 10.0


class LogSink(Protocol):
    """The part of ``logging.Logger`` we use; Prefect's run logger (an adapter) fits too."""

    def debug(self, msg: object, *args: object) -> None: ...
    def info(self, msg: object, *args: object) -> None: ...
    def warning(self, msg: object, *args: object) -> None: ...


_default_log = logging.getLogger(__name__)


def log_tail(path: str | Path | None, lines: int = LOG_TAIL_LINES, *, offset: int = 0) -> list[str]:
    """The last ``lines`` non-empty lines of a log, reading only from byte ``offset`` on.

    Progress bars (tqdm) redraw with ``\\r``, so ``\\r`` splits lines too: the last segment is
    what a terminal would show.
    """
    if path is None:
        return []
    try:
        with open(path, "rb") as f:
            f.seek(0, 2)
            size = f.tell()
            start = max(offset, size - _TAIL_BYTES)
            f.seek(start)
            data = f.read()
    except OSError:
        return []
    text = data.decode("utf-8", errors="replace")
    parts = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    return [p.rstrip() for p in parts if p.strip()][-lines:]


async def nothing_listens(url: str, timeout_s: float = 5.0) -> str | None:
    """Why no server can be listening at ``url`` (refused, unknown host), or None when a TCP
    connection opens or the attempt only timed out (a slow network or a busy host)."""
    parts = urlsplit(url)
    host = parts.hostname or "127.0.0.1"
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout_s)
    except ConnectionRefusedError:
        return "connection refused"
    except socket.gaierror as err:
        return f"cannot resolve host {host!r}: {err.strerror or err}"
    except (TimeoutError, OSError):
        return None
    writer.close()
    try:
        await writer.wait_closed()
    except OSError:
        pass
    return None


async def check_listens(url: str, limit_s: float = ATTACH_REFUSED_S, poll_s: float = 0.5) -> None:
    """Return once a connection to ``url`` opens (or only times out); raise as the attach
    gate does when nothing listens there for ``limit_s``. The command line's check of an
    attached server, before Prefect starts."""
    refusal = _Refusal(limit_s)
    while True:
        await refusal.update(url, 0, time.monotonic())
        if refusal.why is None:
            return
        await asyncio.sleep(poll_s)


def _status_text(status: int, refused: str | None) -> str:
    return str(status) if status else (refused or "no answer")


def _redactor(process: ServerProcess | None) -> Callable[[str], str]:
    return process.redact if process is not None else redact_text


def _tail_block(process: ServerProcess | None, log_path: str | Path | None) -> str:
    offset = process.log_offset if process is not None else 0
    tail = log_tail(log_path, offset=offset)
    if not tail:
        return f"(no server output in {log_path})" if log_path else "(no server log)"
    redact = _redactor(process)
    body = "\n".join(f"  | {redact(line)}" for line in tail)
    return f"last {len(tail)} lines of {log_path}:\n{body}"


async def wait_until_healthy(
    client_or_url: SGLangClient | str,
    *,
    deadline_s: float,
    process: ServerProcess | None = None,
    log_path: str | Path | None = None,
    progress_every_s: float = 30.0,
    poll_interval_s: float = 0.5,
    api_key: str | None = None,
    logger: LogSink | None = None,
    refused_limit_s: float | None = None,
) -> float:
    """Poll ``/health_generate`` until it answers 200; return the seconds waited.

    Connection refused/reset, timeouts and 503 mean "still starting". SGLang serves
    ``/health*`` without the API key, so a wrong key is not seen here but by pre-flight's
    ``/server_info``. If ``process`` exits, or ``deadline_s`` passes,
    :class:`ServerStartupError` carries the exit code or elapsed time and the log tail. With
    ``refused_limit_s`` (attaching to a server that should be up), connections refused for that
    long raise at once: nothing listens at the URL.
    """
    log = logger or _default_log
    if log_path is None and process is not None:
        log_path = process.log_path
    own_client = isinstance(client_or_url, str)
    client = (
        SGLangClient(client_or_url, api_key=api_key, timeout_s=30.0)
        if isinstance(client_or_url, str)
        else client_or_url
    )
    start = time.monotonic()
    next_progress = start + progress_every_s
    last_status = 0
    refusal = _Refusal(refused_limit_s) if refused_limit_s is not None else None
    try:
        while True:
            elapsed = time.monotonic() - start
            refused = refusal.why if refusal else None
            _raise_if_gone_or_late(
                client.base_url, process, log_path, elapsed, deadline_s, last_status, refused
            )
            last_status = await _health(client, deadline_s - elapsed, log)
            if last_status == 200:
                elapsed = time.monotonic() - start
                log.debug("server at %s is healthy after %.1f s", client.base_url, elapsed)
                return elapsed
            now = time.monotonic()
            if refusal is not None:
                await refusal.update(client.base_url, last_status, now)
            if now >= next_progress:
                next_progress = now + progress_every_s
                refused = refusal.why if refusal else None
                _log_waiting(
                    log, client.base_url, now - start, last_status, refused, process, log_path
                )
            await asyncio.sleep(poll_interval_s)
    finally:
        if own_client:
            await client.aclose()


def _raise_if_gone_or_late(
    url: str,
    process: ServerProcess | None,
    log_path: str | Path | None,
    elapsed: float,
    deadline_s: float,
    last_status: int,
    refused: str | None,
) -> None:
    """The gate gives up: the server process exited, or the deadline passed (with the log tail)."""
    if process is not None and (code := process.poll()) is not None:
        raise ServerStartupError(
            f"server exited with code {code} after {elapsed:.1f} s during startup; "
            f"{_tail_block(process, log_path)}"
        )
    if deadline_s - elapsed <= 0:
        raise ServerStartupError(
            f"server at {url} not healthy after {elapsed:.0f} s "
            f"(deadline {deadline_s:.0f} s, last {READY_PATH} status "
            f"{_status_text(last_status, refused)}); {_tail_block(process, log_path)}"
        )


async def _health(client: SGLangClient, remaining: float, log: LogSink) -> int:
    """One poll of the ready path: its HTTP status, 0 for no answer."""
    try:
        return await client.health_status(READY_PATH, timeout_s=max(1.0, min(remaining, 30.0)))
    except Exception as err:
        log.debug("health poll failed: %r", err)
        return 0


class _Refusal:
    """How long nothing has listened at an attached server's URL; past ``limit_s`` the gate
    stops waiting (a wrong URL, or no server there)."""

    def __init__(self, limit_s: float) -> None:
        self.limit_s = limit_s
        self.why: str | None = None  # why nothing listens, while that lasts
        self.since = 0.0

    async def update(self, url: str, status: int, now: float) -> None:
        was = self.why
        self.why = await nothing_listens(url) if status == 0 else None
        self.since = self.since if was else now
        if self.why and now - self.since >= self.limit_s:
            raise ServerStartupError(
                f"nothing listens at {url} ({self.why} for "
                f"{now - self.since:.0f} s): check the URL, or start the run once "
                "the server accepts connections (SGLang does once its weights are "
                "loaded)"
            )


def _log_waiting(
    log: LogSink,
    url: str,
    elapsed: float,
    status: int,
    refused: str | None,
    process: ServerProcess | None,
    log_path: str | Path | None,
) -> None:
    """The periodic "still waiting" line: the status, and the server log's last line if the
    run has a log of the server (an attached server has none)."""
    line = f"waiting for server at {url}: {elapsed:.0f} s elapsed, {READY_PATH} "
    line += _status_text(status, refused)
    if log_path is not None:
        tail = log_tail(log_path, 1, offset=process.log_offset if process else 0)
        redact: Callable[[str], str] = process.redact if process is not None else redact_text
        line += "; log: " + (redact(tail[-1])[-300:] if tail else "(no output yet)")
    log.info(line)
