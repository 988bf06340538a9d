"""A run that someone stops ends Cancelled, every part of it, never Crashed.

Two things in Prefect 3 make a stopped run read as a crash, and this module undoes both:

- A flow or task whose coroutine gets ``asyncio.CancelledError`` is recorded Crashed
  ("Execution was cancelled by the runtime environment"). Our flows and the batch task catch
  the cancellation where their own code runs (:func:`cancelled`) and return Prefect's
  Cancelled state, which the engine records as it is.
- A worker stops a run cancelled from the UI with SIGTERM, which Prefect turns into an
  exception raised wherever the main thread happens to be (often the event loop itself, whose
  end then cancels every task at once). While a flow body runs, :func:`cancel_on_sigterm`
  makes SIGTERM cancel the outermost flow's task instead: the same orderly unwinding as Ctrl-C
  of the command line (batches first, then subflows, then the server, stopped on purpose).
  Not where the pod's supervisor owns SIGTERM (``PREFECT_FLOW_RUN_EXECUTE_SIGTERM_BEHAVIOR``
  ``reschedule`` or ``relinquish``, the Kubernetes recipe): there a SIGTERM is an eviction, the
  run must be rescheduled rather than Cancelled, and Prefect's own handling stays.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import AsyncIterator
from typing import Any

import prefect.runtime
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import (
    FlowRunFilter,
    FlowRunFilterParentFlowRunId,
    FlowRunFilterState,
    FlowRunFilterStateType,
    TaskRunFilter,
    TaskRunFilterFlowRunId,
    TaskRunFilterState,
    TaskRunFilterStateType,
)
from prefect.client.schemas.objects import StateType
from prefect.exceptions import TerminationSignal
from prefect.states import Cancelled, State

from eagle3_datagen.report.outcome import RunOutcome

# The flows' tasks that SIGTERM cancels (the first, outermost one), while their bodies run.
_bodies: list[asyncio.Task[Any]] = []
_previous: list[Any] = []  # the SIGTERM handler found when the outermost body started
#: The signals that cancelled a flow body in this process (the command line reads it).
received: list[int] = []
#: The outermost flow run whose body ran in this process (the command line marks what a
#: stop left of it: :func:`cancel_crashed`).
outermost_run: list[Any] = []
# Where `prefect flow-run execute` is told to reschedule or relinquish on SIGTERM, the signal
# means the pod is going away, not that someone stopped the run.
_SUPERVISOR_BEHAVIOR = "PREFECT_FLOW_RUN_EXECUTE_SIGTERM_BEHAVIOR"


def supervised() -> bool:
    """Whether this process runs under a supervisor that owns SIGTERM (a pod's
    ``prefect flow-run execute`` set to reschedule or relinquish, see above)."""
    return os.environ.get(_SUPERVISOR_BEHAVIOR, "").lower() in ("reschedule", "relinquish")


def cancelled(message: str) -> State[Any]:
    """Prefect's Cancelled state with ``message``, for a flow or task to return when its
    coroutine was cancelled; the task's cancellation is taken back (it was handled), so the
    engine can record the state.

    Under a supervisor that owns SIGTERM the cancellation is the pod going away: it goes on
    (raised again), so that Prefect reschedules the run instead of recording it Cancelled."""
    if supervised():
        raise asyncio.CancelledError(message)
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        task.uncancel()
    return Cancelled(message=message)


def is_a_stop(err: BaseException) -> bool:
    """A stop that someone asked for: a cancellation from the UI or API (SIGTERM from the
    worker), Ctrl-C, or the task's cancellation by the command line's signal handler."""
    return isinstance(err, asyncio.CancelledError | KeyboardInterrupt | TerminationSignal)


def stopped_run(err: BaseException, outcome: RunOutcome) -> State[Any]:
    """The run stopped on ``err``: the outcome notes it; a cancellation (Ctrl-C, Cancel) makes
    the run's Cancelled state, saying what had completed; anything else is raised again."""
    outcome.stopped(err, cancelled=is_a_stop(err))
    if not isinstance(err, asyncio.CancelledError) or supervised():
        raise err
    return cancelled(outcome.cancelled_message())


# What a stop can leave of a run Prefect was starting: Crashed, or never past Pending.
_LEFT_BEHIND = [StateType.CRASHED, StateType.PENDING]


async def cancel_crashed(flow_run_id: Any, message: str) -> int:
    """Set Cancelled what a stop left Crashed or Pending under ``flow_run_id``: its task runs
    and its subflow runs; how many.

    A stop that lands while Prefect is still starting a batch task or a subflow (its engine
    creating the run, before our code runs) leaves it Pending, or Crashed: "Execution was
    cancelled by the runtime environment", the engine, not our code, received the
    cancellation. It was stopped like the others, so it says so. Called once everything under
    the run ended."""
    crashed = TaskRunFilter(
        flow_run_id=TaskRunFilterFlowRunId(any_=[flow_run_id]),
        state=TaskRunFilterState(type=TaskRunFilterStateType(any_=_LEFT_BEHIND)),
    )
    subflows = FlowRunFilter(
        parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=[flow_run_id]),
        state=FlowRunFilterState(type=FlowRunFilterStateType(any_=_LEFT_BEHIND)),
    )
    async with get_client() as client:
        tasks = await client.read_task_runs(task_run_filter=crashed)
        for task in tasks:
            await client.set_task_run_state(task.id, Cancelled(message=message), force=True)
        subs = await client.read_flow_runs(flow_run_filter=subflows)
        for sub in subs:
            await client.set_flow_run_state(sub.id, Cancelled(message=message), force=True)
    return len(tasks) + len(subs)


def _on_sigterm() -> None:
    """The first SIGTERM starts the stop; a later one (a worker whose first went unanswered
    sends more) would cancel batches again while they record their Cancelled state."""
    if received:
        return
    received.append(signal.SIGTERM)
    for task in _bodies:
        if not task.done():
            task.cancel()
            return


def _arm(loop: asyncio.AbstractEventLoop) -> bool:
    try:
        loop.add_signal_handler(signal.SIGTERM, _on_sigterm)
    except (ValueError, RuntimeError, NotImplementedError):  # not the main thread
        return False
    return True


@contextlib.asynccontextmanager
async def cancel_on_sigterm() -> AsyncIterator[None]:
    """While the block runs, SIGTERM cancels the outermost flow body's task (see above).

    Each flow body enters it (a subflow's engine installs Prefect's handler again when it
    starts, so the subflow takes it back); when the outermost leaves, the handler it found
    comes back."""
    task = asyncio.current_task()
    loop = asyncio.get_running_loop()
    if not _bodies:
        outermost_run[:] = [prefect.runtime.flow_run.id]
    if task is None or supervised():
        yield
        return
    outermost = not _bodies
    if outermost:
        _previous[:] = [signal.getsignal(signal.SIGTERM)]
        received.clear()
    if not _arm(loop):
        yield
        return
    _bodies.append(task)
    try:
        yield
    finally:
        _bodies.remove(task)
        if outermost:
            loop.remove_signal_handler(signal.SIGTERM)
            with contextlib.suppress(TypeError, ValueError):
                signal.signal(signal.SIGTERM, _previous[0])
        else:
            _arm(loop)  # the subflow's engine restores the handler it found: ours
