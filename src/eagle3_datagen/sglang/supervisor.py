"""Noticing a lost server mid-run, and getting it back: wait for it, or relaunch it.

Why: a 100k-prompt run lasts many hours and servers die (OOM, driver resets, a node reboot).
Without this, every request in flight burns its retries against a dead port and the run fails.
With it, after ``failure_threshold`` consecutive connection failures all requests pause, the
health gate runs again, and in launch mode the server is relaunched (at most
``max_relaunches`` times); then the requests carry on where they stopped.

When it does not come back (attach mode: the gate's deadline passed; launch mode: lost again
after ``max_relaunches``), the server is lost for good: every request waiting or to come raises
one :class:`ServerLost` naming the server, when it last answered and the last error, so every
partition stops at once instead of retrying batches against a server that is not there.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import time
from collections.abc import Awaitable, Callable

from eagle3_datagen.errors import ServerError, ServerLost
from eagle3_datagen.sglang.health import LogSink


class ServerSupervisor:
    """Shared by every partition of a run that talks to one server."""

    def __init__(
        self,
        *,
        check: Callable[[float], Awaitable[object]],
        relaunch: Callable[[], Awaitable[object]] | None,
        logger: LogSink,
        failure_threshold: int = 5,
        max_relaunches: int = 2,
        check_deadline_s: float = 60.0,
        name: str = "the server",
    ) -> None:
        self._check = check  # the health gate with a deadline; raises when not healthy
        self._relaunch = relaunch  # None in attach mode: we never restart a server we don't own
        self._log = logger
        self.failure_threshold = failure_threshold
        self.max_relaunches = max_relaunches
        self.check_deadline_s = check_deadline_s
        self.relaunches = 0
        self.recoveries = 0
        self.name = name
        self.failed: str | None = None  # the ServerLost message, once lost for good
        self.last_seen = time.time()  # wall clock of the last answer (or of the start)
        self.last_error = ""
        self._consecutive = 0
        self._available = asyncio.Event()
        self._available.set()
        self._recovery: asyncio.Task[None] | None = None

    async def before_request(self) -> None:
        """Wait while the server is being recovered; raise if it is gone for good."""
        if not self._available.is_set():
            await self._available.wait()
        if self.failed:
            raise ServerLost(self.failed)

    @property
    def lost(self) -> bool:
        return self.failed is not None

    def on_success(self) -> None:
        self._consecutive = 0
        self.last_seen = time.time()

    def on_connection_error(self, error: str = "") -> None:
        """Count a refused/reset/timed-out request; start a recovery at the threshold."""
        if error:
            self.last_error = error
        self._consecutive += 1
        if self._consecutive >= self.failure_threshold and self._available.is_set():
            self._available.clear()
            self._recovery = asyncio.create_task(self._recover())

    async def _recover(self) -> None:
        started = time.monotonic()
        self.recoveries += 1
        self._log.warning(
            f"server lost ({self._consecutive} consecutive connection failures); "
            "pausing requests and re-running the health gate"
        )
        try:
            try:
                await self._check(self.check_deadline_s)
            except ServerError as err:
                if self._relaunch is None:
                    raise ServerError(
                        f"not back within the health deadline of {self.check_deadline_s:g} s "
                        f"(attached: the run never restarts it): {err}"
                    ) from None
                if self.relaunches >= self.max_relaunches:
                    raise ServerError(
                        f"lost again after {self.relaunches} relaunches "
                        f"(server.max_relaunches): {err}"
                    ) from None
                self.relaunches += 1
                self._log.warning(
                    f"relaunching the server ({self.relaunches}/{self.max_relaunches}): {err}"
                )
                await self._relaunch()
            self._consecutive = 0
            self.last_seen = time.time()
            self._log.info(f"server back after {time.monotonic() - started:.1f} s; resuming")
        except Exception as err:  # whatever it was, requests must stop waiting
            self.failed = self._lost_message(str(err))
            self._log.warning(self.failed)
        finally:
            self._available.set()

    def _lost_message(self, why: str) -> str:
        seen = dt.datetime.fromtimestamp(self.last_seen, dt.UTC).isoformat(timespec="seconds")
        ago = time.time() - self.last_seen
        last = self.last_error or "none recorded"
        return (
            f"server {self.name} lost for good: last answered at {seen} ({ago:.0f} s ago); "
            f"last request error: {last}; {why}"
        )

    async def aclose(self) -> None:
        if self._recovery is not None and not self._recovery.done():
            self._recovery.cancel()
            try:
                await self._recovery
            except asyncio.CancelledError:
                pass
