"""A stop someone asked for (Ctrl-C, SIGTERM, a Cancel from the UI): one object per run that
says whether, when and by which signal the run was stopped, and which task the stop cancels.

The command line makes it and binds it around the run (:meth:`RunStop.bound`); the flow bodies
and the batch task read the bound one (:func:`current_stop`), or, run by a worker with no
command line, the outermost flow body makes its own. What happened is then read off the object,
not out of process-wide lists: the command line learns from it that the flow took a SIGTERM
itself, which flow run to mark, and the clean-up learns when the stop began, so a batch that
failed after that moment (its requests aborted, or the stop landing between a failed attempt
and its retry) is recorded Cancelled, not Failed.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import Any

_bound: ContextVar[RunStop | None] = ContextVar("eagle3_datagen_run_stop", default=None)


class RunStop:
    """The stop state of one run in this process."""

    def __init__(self, on_stop: Callable[[int], None] | None = None) -> None:
        self.signum: int | None = None  # the signal that stopped the run
        self.at: datetime | None = None  # when the stop began (UTC)
        self.run_id: Any = None  # the outermost flow run whose body ran in this process
        self._task: asyncio.Task[Any] | None = None
        self._on_stop = on_stop

    @property
    def requested(self) -> bool:
        return self.signum is not None

    def attach(self, task: asyncio.Task[Any]) -> None:
        """The task a stop cancels: the first one attached (the command line's run, or the
        outermost flow body when no command line started it)."""
        if self._task is None or self._task.done():
            self._task = task

    def note_run(self, run_id: Any) -> None:
        """The outermost flow run of this process (the first one noted)."""
        if self.run_id is None:
            self.run_id = run_id

    def request(self, signum: int = signal.SIGINT) -> bool:
        """Stop the run: the first request records the signal and the time, tells ``on_stop``
        and cancels the attached task; a later one (a second Ctrl-C, a worker's repeated
        SIGTERM) changes nothing while the stop unwinds. Whether this one started the stop."""
        if self.requested:
            return False
        self.signum = signum
        self.at = datetime.now(UTC)
        if self._on_stop is not None:
            self._on_stop(signum)
        if self._task is not None and not self._task.done():
            self._task.cancel()
        return True

    def began_before(self, when: datetime | None) -> bool:
        """Whether the stop had begun at ``when`` (a state's timestamp): what ended after it
        ended because of it."""
        return self.at is not None and when is not None and when >= self.at

    @contextlib.contextmanager
    def bound(self) -> Iterator[RunStop]:
        """While the block runs (and in every task started in it), :func:`current_stop` is
        this object."""
        token = _bound.set(self)
        try:
            yield self
        finally:
            _bound.reset(token)


def current_stop() -> RunStop | None:
    """The run's stop object bound in this context, if any."""
    return _bound.get()
