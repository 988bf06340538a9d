"""A pipeline run in this process, as ``eagle3-datagen run`` and ``demo`` start it: the parent
flow (or the fan-out) on the Prefect API of ``prefect_server.py``, stopped by ``signals.py``'s
Ctrl-C and SIGTERM handling, its end told as the manifest or one line.

Prefect is imported here only when a run starts, so commands that need none start fast.
"""

from __future__ import annotations

import asyncio
from typing import Any

from eagle3_datagen.config import PipelineConfig
from eagle3_datagen.stop import RunStop
from eagle3_datagen_cli.console import one_line
from eagle3_datagen_cli.signals import Interrupted, mark_cancelled, stop_on_signals


async def _flow_state(
    config: PipelineConfig,
    partitions: list[str] | None,
    server_url: str | None,
    overwrite: bool,
    fan_out: str | None,
    on_crashed: Any,
) -> Any:
    """The flow's final Prefect State: the fan-out over ``fan_out``'s deployment, or the
    parent flow here; ``on_crashed`` is added to the flow's own crash hooks."""
    if fan_out:
        from eagle3_datagen_flows.fanout import datagen_fanout

        return await datagen_fanout.with_options(
            on_crashed=[*datagen_fanout.on_crashed_hooks, on_crashed]
        )(
            config=config,
            partitions=partitions or None,
            deployment=fan_out,
            overwrite=overwrite,
            return_state=True,
        )
    from eagle3_datagen_flows.pipeline import datagen

    return await datagen.with_options(on_crashed=[*datagen.on_crashed_hooks, on_crashed])(
        config=config,
        partitions=partitions or None,
        server_url=server_url,
        overwrite=overwrite,
        return_state=True,
    )


def run_pipeline(
    config: PipelineConfig,
    *,
    partitions: list[str] | None = None,
    server_url: str | None = None,
    overwrite: bool = False,
    fan_out: str | None = None,
) -> tuple[bool, dict[str, Any] | str]:
    """Run the parent flow in this process; return (completed, manifest or one-line reason
    naming the flow run whose log holds the tracebacks, which the terminal does not show).

    With ``fan_out`` (a deployment name), each partition instead runs as a job of that
    deployment on its work pool's workers, and this process only waits and merges. SIGINT or
    SIGTERM stops the run within seconds, marks it Cancelled and raises
    :class:`~eagle3_datagen_cli.signals.Interrupted` (see ``signals.py``).
    """
    from eagle3_datagen_cli.prefect_server import prefect_env, temporary_prefect_server

    prefect_env()
    from eagle3_datagen_cli.console import quiet_console_tracebacks, stopping_now

    quiet_console_tracebacks()
    runs: list[Any] = []  # the flow run, once Prefect says how it ended (its hooks)
    stop = RunStop(on_stop=stopping_now)  # the run's one stop state, read by the flows too

    def seen(flow: Any, flow_run: Any, state: Any) -> None:
        runs.append(flow_run)

    async def _mark(why: str) -> None:
        for run_id in [r.id for r in runs[:1]] or [stop.run_id]:
            if run_id is not None:
                await mark_cancelled(run_id, why, stop.at)

    async def _main() -> Any:
        # A task that ended on the interrupt while the loop itself was interrupted is not news.
        asyncio.get_running_loop().set_exception_handler(_quiet_interrupts)
        try:
            with stop.bound():
                return await stop_on_signals(
                    _flow_state(config, partitions, server_url, overwrite, fan_out, seen), stop
                )
        except Interrupted as stopped:
            await _mark(stopped.why)
            raise

    from prefect.exceptions import TerminationSignal

    with temporary_prefect_server():
        try:
            state = asyncio.run(_main())
        except TerminationSignal as sig:  # Prefect's SIGTERM bridge, armed while a flow runs
            halt = Interrupted(sig.signal)
            asyncio.run(_mark(halt.why))
            raise halt from None
        if state.is_completed():
            return True, asyncio.run(state.aresult())
    return False, _failed(state)


def _failed(state: Any) -> str:
    """A failed run's reason in one line, naming where its tracebacks are."""
    from eagle3_datagen_flows.prefect_text import failure_reason

    reason = failure_reason(state.message, state.type.value)
    run_id = state.state_details.flow_run_id
    return one_line(f"{reason} (log: uv run prefect flow-run logs {run_id})" if run_id else reason)


def _quiet_interrupts(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    err = context.get("exception")
    if not isinstance(err, Interrupted | asyncio.CancelledError):
        loop.default_exception_handler(context)
