"""A run that someone stops ends Cancelled, every part of it, never Crashed.

Two things in Prefect 3 make a stopped run read as a crash, and this module undoes both:

- A flow or task whose coroutine gets ``asyncio.CancelledError`` is recorded Crashed
  ("Execution was cancelled by the runtime environment"). Our flows and the batch task catch
  the cancellation where their own code runs (:func:`cancelled`) and return Prefect's
  Cancelled state, which the engine records as it is; what the cancellation reached inside
  Prefect's engine instead (a task being started, or between a failed attempt and its retry)
  is set Cancelled once everything under the run ended (:func:`cancel_left_behind`).
- A worker stops a run cancelled from the UI with SIGTERM, which Prefect turns into an
  exception raised wherever the main thread happens to be (often the event loop itself, whose
  end then cancels every task at once). While a flow body runs, :func:`flow_body` makes
  SIGTERM stop the run through its stop object (``eagle3_datagen.stop``) instead: the same
  orderly unwinding as Ctrl-C of the command line (batches first, then subflows, then the
  server, stopped on purpose).
  Not where the pod's supervisor owns SIGTERM (``PREFECT_FLOW_RUN_EXECUTE_SIGTERM_BEHAVIOR``
  ``reschedule`` or ``relinquish``, the Kubernetes recipe): there a SIGTERM is an eviction, the
  run must be rescheduled rather than Cancelled, and Prefect's own handling stays.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from datetime import datetime
from typing import Any
from uuid import UUID

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
from eagle3_datagen.stop import RunStop, current_stop

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


# What a stop can leave of a run Prefect was starting or retrying: Crashed, never past Pending,
# Scheduled (AwaitingRetry), or still Running in the API because its engine was cancelled.
_LEFT_BEHIND = [StateType.CRASHED, StateType.PENDING, StateType.SCHEDULED, StateType.RUNNING]


def _stopped_it(state: Any, since: datetime | None) -> bool:
    """Whether ``state`` is what a stop left: one of _LEFT_BEHIND, or Failed at or after
    ``since``, the moment the stop began (a batch whose requests the stop aborted, or that the
    stop caught between a failed attempt and its retry)."""
    if state is None:
        return False
    if state.type in _LEFT_BEHIND:
        return True
    return state.type == StateType.FAILED and since is not None and state.timestamp >= since


async def cancel_left_behind(flow_run_id: Any, message: str, since: datetime | None) -> int:
    """Set Cancelled what a stop left under ``flow_run_id`` (its task runs and its subflow
    runs): Crashed, Pending, Scheduled or Running, and Failed since ``since``; how many.

    A stop that lands while Prefect is still starting a batch task or a subflow (its engine
    creating the run, before our code runs), or while its engine handles a failed attempt,
    leaves it Pending or Crashed ("Execution was cancelled by the runtime environment": the
    engine, not our code, received the cancellation). It was stopped like the others, so it
    says so. Called once everything under the run ended."""
    types = [*_LEFT_BEHIND, StateType.FAILED]
    tasks_under = TaskRunFilter(
        flow_run_id=TaskRunFilterFlowRunId(any_=[flow_run_id]),
        state=TaskRunFilterState(type=TaskRunFilterStateType(any_=types)),
    )
    subflows = FlowRunFilter(
        parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=[flow_run_id]),
        state=FlowRunFilterState(type=FlowRunFilterStateType(any_=types)),
    )
    marked = 0
    async with get_client() as client:
        for task in await client.read_task_runs(task_run_filter=tasks_under):
            if _stopped_it(task.state, since):
                await client.set_task_run_state(task.id, Cancelled(message=message), force=True)
                marked += 1
        for sub in await client.read_flow_runs(flow_run_filter=subflows):
            if _stopped_it(sub.state, since):
                await client.set_flow_run_state(sub.id, Cancelled(message=message), force=True)
                marked += 1
    return marked


def stop_of_this_run() -> RunStop:
    """The run's stop object: the one the command line bound, else a new one (a worker's run),
    which the outermost flow body binds (:func:`flow_body`)."""
    return current_stop() or RunStop()


def _arm(loop: asyncio.AbstractEventLoop, stop: RunStop) -> bool:
    try:
        loop.add_signal_handler(signal.SIGTERM, stop.request, signal.SIGTERM)
    except (ValueError, RuntimeError, NotImplementedError):  # not the main thread
        return False
    return True


@contextlib.asynccontextmanager
async def flow_body() -> AsyncIterator[RunStop]:
    """While a flow body runs: the run's stop object is bound (the command line's, or a new one
    for the outermost body of a worker's run), the outermost flow run noted on it, and SIGTERM
    stops the run through it (see above): a first SIGTERM cancels the task attached to it (the
    command line's run or the outermost body), a later one changes nothing.

    Each flow body enters it (a subflow's engine installs Prefect's handler again when it
    starts, so the subflow takes it back); when the outermost leaves, the handler it found
    comes back."""
    stop = stop_of_this_run()
    task = asyncio.current_task()
    loop = asyncio.get_running_loop()
    outermost = stop.run_id is None
    stop.note_run(prefect.runtime.flow_run.id)
    with stop.bound():
        if task is None or supervised():
            yield stop
            return
        stop.attach(task)
        previous = signal.getsignal(signal.SIGTERM) if outermost else None
        if not _arm(loop, stop):
            yield stop
            return
        try:
            yield stop
        finally:
            if outermost:
                loop.remove_signal_handler(signal.SIGTERM)
                with contextlib.suppress(TypeError, ValueError):
                    signal.signal(signal.SIGTERM, previous)
            else:
                _arm(loop, stop)  # the subflow's engine restores the handler it found: ours


# What Prefect's runner writes last when a worker stops a run cancelled from the UI (see
# keep_own_message); the run's own Cancelled message said more.
RUNNER_CANCELLED = "Flow run was cancelled successfully."
KEEP_OWN_MESSAGE_S = 120.0  # how long the worker waits for the runner's state, at most


def keep_own_message(flow: Any, flow_run: Any, state: State[Any]) -> None:
    """on_cancellation, for a run a worker stops (Cancel from the UI): the run's own Cancelled
    message (``2 of 3 partitions completed (...); a rerun finishes demo_long``) stays its last
    state's.

    Prefect's runner (the worker) stops the run's process with SIGTERM; the run unwinds and
    records Cancelled with its own message; once the process has exited, the runner runs this
    hook (with a Cancelling state it makes up; a process worker runs it in a subprocess of its
    own) and then writes its own Cancelled state, ``Flow run was cancelled successfully.``,
    over the run's (with ``force``; Prefect 3.9's ``runner/_cancellation_manager.py``, no
    setting changes it). The hook is the one thing of ours that runs at that moment, and it
    runs before that write: so it reads the run's own message now and starts a watcher, a
    process of its own session that outlives the hook's, which writes the message back as the
    last Cancelled state once the runner's has landed (:func:`_write_back`, at most
    KEEP_OWN_MESSAGE_S). Anywhere else (the run's own process, whose state is not Cancelled
    yet) it does nothing."""
    if not state.is_cancelling():
        return
    from prefect.client.orchestration import get_client as client_of

    with client_of(sync_client=True) as client:
        now = client.read_flow_run(flow_run.id).state
    if now is None or not now.is_cancelled() or now.message in (None, "", RUNNER_CANCELLED):
        return  # the run recorded no message of its own (killed before it could)
    subprocess.Popen(
        [sys.executable, "-m", __name__, str(flow_run.id), str(now.id), str(now.message)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


def _write_back(flow_run_id: str, own_state: str, own: str) -> None:
    """Wait (at most KEEP_OWN_MESSAGE_S) for another Cancelled state after the run's own
    (``own_state``), then write the run's own message back; a run in any other state (retried,
    rescheduled) is left as it is."""
    from prefect.client.orchestration import get_client as client_of

    deadline = time.monotonic() + KEEP_OWN_MESSAGE_S
    with client_of(sync_client=True) as client:
        while time.monotonic() < deadline:
            now = client.read_flow_run(UUID(flow_run_id)).state
            if now is None or not now.is_cancelled():
                return
            if str(now.id) != own_state and now.message != own:
                client.set_flow_run_state(UUID(flow_run_id), Cancelled(message=own), force=True)
                return
            time.sleep(0.5)


if __name__ == "__main__":  # the watcher keep_own_message starts
    _write_back(*sys.argv[1:4])
