"""Noticing a lost server mid-run, getting it back, and stopping the run at the first fault
that no retry can fix.

Why: a 100k-prompt run lasts many hours and servers die (OOM, driver resets, a node reboot).
Without this, every request in flight burns its retries against a dead port and the run fails.
With it, after ``failure_threshold`` consecutive connection failures all requests pause, the
health gate runs again (for a pool of servers: until any of them passes), and in launch mode
the server is relaunched (at most ``max_relaunches`` times); then the requests carry on where
they stopped.

The supervisor is also the run's one stop: when a cause that no retry can fix shows up
anywhere (the server, or every server of a pool, lost for good; a refused API key; a full or
read-only disk; an input file gone or changed; see ``errors.final_cause``), :meth:`stop`
records it once, the requests in flight are cancelled (SGLang aborts a request whose client
went away), and every request waiting or to come and every batch not yet started raises an
error of the same type with one message naming the cause. Every partition then stops within
seconds, instead of each batch failing on its own, with its retries.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from eagle3_datagen.errors import (
    DatagenError,
    PreflightError,
    ServerError,
    ServerLost,
    final_cause,
)
from eagle3_datagen.sglang.health import LogSink

T = TypeVar("T")


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
        name: str = "the server",  # as the lost message names it, e.g. "server http://h:8000"
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
        self.failed: str | None = None  # the run's one stop message, once stopped
        self.cause: DatagenError | None = None  # what stopped it (its type is re-raised)
        self.stopped_at: float | None = None  # time.monotonic() of the stop
        self._in_flight: set[asyncio.Task[Any]] = set()
        self._cancelled: set[asyncio.Task[Any]] = set()
        self.last_seen = time.time()  # wall clock of the last answer (or of the start)
        self.last_error = ""
        self._consecutive = 0
        self._available = asyncio.Event()
        self._available.set()
        self._recovery: asyncio.Task[None] | None = None
        self.standing_down = False  # the run is ending: its server is stopped on purpose

    async def before_request(self) -> None:
        """Wait while the server is being recovered; raise if the run has stopped."""
        if not self._available.is_set():
            await self._available.wait()
        self.raise_if_stopped()

    @property
    def lost(self) -> bool:
        return self.failed is not None

    def error(self) -> DatagenError:
        """A fresh error of the stopping cause's type, with the run's one message."""
        assert self.cause is not None and self.failed is not None
        err: DatagenError
        try:
            err = type(self.cause)(self.failed)
        except TypeError:  # a cause type with another constructor: its message still counts
            err = ServerError(self.failed)
        return err

    def raise_if_stopped(self) -> None:
        if self.failed is not None:
            raise self.error()

    def stop(self, err: BaseException) -> bool:
        """Stop the run if ``err`` has a cause no retry can fix; the first such cause wins.

        Returns whether the run is stopped now. Requests in flight are cancelled and raise the
        cause's error (see :meth:`guard`).
        """
        if self.failed is not None:
            return True
        cause = final_cause(err)
        if cause is None:
            return False
        self.cause = cause
        self.failed = str(cause)
        self.stopped_at = time.monotonic()
        self._log.warning(f"stopping every partition (no retry can fix this): {self.failed}")
        self._available.set()
        for task in list(self._in_flight):
            self._cancelled.add(task)
            task.cancel()
        return True

    async def guard(self, request: Awaitable[T]) -> T:
        """Await one request; if the run stops meanwhile, it is cancelled and raises the
        stopping cause's error (no request outlives the run's stop)."""
        self.raise_if_stopped()
        task = asyncio.current_task()
        if task is None:
            return await request
        self._in_flight.add(task)
        try:
            return await request
        except asyncio.CancelledError:
            if task in self._cancelled:
                self._cancelled.discard(task)
                task.uncancel()
                raise self.error() from None
            raise
        finally:
            self._in_flight.discard(task)

    def on_success(self) -> None:
        self._consecutive = 0
        self.last_seen = time.time()

    def on_connection_error(self, error: str = "") -> None:
        """Count a refused/reset/timed-out request; start a recovery at the threshold (never
        once the run stands down: its server is then stopped on purpose, not lost)."""
        if self.standing_down:
            return
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
            except PreflightError:
                raise  # back, but unusable (e.g. it refuses our API key): nothing to wait for
            except ServerError as err:
                if self.standing_down:
                    return  # stopped on purpose while it was checked: nothing to relaunch
                if self._relaunch is None:
                    raise ServerError(
                        f"not back within the health deadline of {self.check_deadline_s:g} s "
                        f"(attached: the run never restarts it): {err}"
                    ) from None
                if self.relaunches >= self.max_relaunches:
                    raise ServerError(
                        f"lost again after {self.relaunches} relaunches "
                        f"(server.recovery.max_relaunches): {err}"
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
            self.stop(ServerLost(self._lost_message(str(err))))
        finally:
            self._available.set()

    def _lost_message(self, why: str) -> str:
        seen = dt.datetime.fromtimestamp(self.last_seen, dt.UTC).isoformat(timespec="seconds")
        ago = time.time() - self.last_seen
        last = self.last_error or "none recorded"
        return (
            f"{self.name} lost for good: last answered at {seen} ({ago:.0f} s ago); "
            f"last request error: {last}; {why}"
        )

    def stand_down(self) -> None:
        """The run is ending (done, cancelled or interrupted): its server is about to be
        stopped on purpose, so failures to reach it are no loss, and nothing is relaunched."""
        self.standing_down = True

    async def aclose(self) -> None:
        self.stand_down()
        if self._recovery is not None and not self._recovery.done():
            self._recovery.cancel()
            try:
                await self._recovery
            except asyncio.CancelledError:
                pass
