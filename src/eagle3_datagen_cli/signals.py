"""Ctrl-C and SIGTERM for a run started from the command line: stop within seconds, cleanly.

A terminal's Ctrl-C sends SIGINT to its whole process group; ``prefect_server.py`` keeps
Prefect's temporary API server out of that group, so the API is still there while the run
stops. Then:

- :func:`stop_on_signals` turns the first SIGINT or SIGTERM into a stop of the run: the run's
  one stop object (``eagle3_datagen.stop.RunStop``, made here and bound around the flow, which
  reads it) records it and cancels the flow's task. The flows unwind in order
  (``flows/stopping.py``): the batches in flight end Cancelled, then the subflows, then the
  parent, whose ``finally`` blocks stop the server it launched (on purpose: never taken for
  lost, never relaunched) and write the summary. The
  launched SGLang server runs in its own session too (``sglang/process.py``), so only the run
  stops it. The command says it is stopping, then the stop's one line, and exits 130;
- :func:`mark_cancelled` then sets Cancelled what did not end so by itself (a fan-out's
  partition jobs, which workers run in their own processes, are set Cancelling).
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Awaitable
from datetime import datetime
from typing import Any, TypeVar

from eagle3_datagen.stop import RunStop

T = TypeVar("T")


class Interrupted(Exception):
    """The run was stopped by a signal; ``signum`` says which."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        super().__init__(f"stopped by {signal.Signals(signum).name}")

    @property
    def why(self) -> str:
        """The stop as the run's state message says it."""
        if self.signum == signal.SIGINT:
            return "stopped with Ctrl-C at the command line"
        return f"stopped by {signal.Signals(self.signum).name} at the command line"


async def stop_on_signals(work: Awaitable[T], stop: RunStop) -> T:
    """Await ``work`` as the task ``stop`` cancels; the first SIGINT or SIGTERM stops it
    (:meth:`~eagle3_datagen.stop.RunStop.request`), and once it has unwound, whether it then
    raised or returned (a flow that ends Cancelled returns), :class:`Interrupted` is raised. So
    is it when the flow took a SIGTERM itself (a flow body arms its own handler, on the same
    object). A second signal while it unwinds changes nothing: the stop is under way."""
    loop = asyncio.get_running_loop()
    task = asyncio.ensure_future(work)
    stop.attach(task)
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.request, signum)
    try:
        result = await task
    except BaseException as err:
        if stop.signum is not None:
            raise Interrupted(stop.signum) from err
        raise
    finally:
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(signum)
    if stop.signum is not None:
        raise Interrupted(stop.signum)
    return result


async def mark_cancelled(flow_run_id: Any, why: str, since: datetime | None) -> None:
    """Set the flow run, and its subflows that did not finish, Cancelled with ``why``.

    A fan-out's partition jobs are deployment runs that workers run in their own processes:
    a running one is set Cancelling, which is what makes its worker stop the job's process
    (whose hooks stop its server) and then mark it Cancelled; Cancelled straight away would
    leave it generating on its node. One not yet running is set Cancelled. A batch task the
    stop caught while Prefect was starting it, recorded Crashed, is set Cancelled too (its
    subflow does the same as it ends; this is the check once everything has ended), and so is
    one that failed after ``since``, when the stop began."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterParentFlowRunId
    from prefect.states import Cancelled, Cancelling

    from eagle3_datagen_flows.stopping import cancel_left_behind

    async with get_client() as client:
        subs = await client.read_flow_runs(
            flow_run_filter=FlowRunFilter(
                parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=[flow_run_id])
            )
        )
        for run in [*subs, await client.read_flow_run(flow_run_id)]:
            ended = run.state is not None and (run.state.is_completed() or run.state.is_cancelled())
            job = run.deployment_id is not None and run.id != flow_run_id
            if ended or (job and run.state is not None and run.state.is_final()):
                continue  # a run that ended on its own (or a job) keeps its own end
            # A job a worker runs is stopped through its worker; one not yet running is not
            # picked up once Cancelled.
            running = job and run.state is not None and run.state.is_running()
            state: Any = Cancelling(message=why) if running else Cancelled(message=why)
            await client.set_flow_run_state(run.id, state, force=True)
    for sub in subs:
        if sub.deployment_id is None:  # a subflow of this process (a job's are its worker's)
            await cancel_left_behind(sub.id, f"{why} before this batch finished", since)
