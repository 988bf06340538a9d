"""The unit of work the dashboard shows: one batch of one partition."""

from __future__ import annotations

import asyncio
from typing import Any

import prefect.runtime
from prefect import Task, get_run_logger, task
from prefect.cache_policies import NO_CACHE
from prefect.client.schemas.objects import TaskRun
from prefect.states import State

from eagle3_datagen.errors import BatchTaskFailed, retry_can_fix
from eagle3_datagen.generate.batch import PartitionRunner
from eagle3_datagen.inputs.prompts import BatchSpec
from eagle3_datagen.report.ui import batch_failure_message
from eagle3_datagen.stop import current_stop
from eagle3_datagen.write.shards import BatchSummary
from eagle3_datagen_flows.stopping import cancelled


def retry_if_it_can_help(task: Task[Any, Any], task_run: TaskRun, state: State[Any]) -> bool:
    """Prefect's retry_condition_fn: retry a batch only for requests that ran out of tries; a
    server lost for good, a full disk or a bad input fails at once (``retry_can_fix``)."""
    err = state.data
    return isinstance(err, BaseException) and retry_can_fix(err)


def retry_delay_s(delays: list[float], attempt: int) -> float:
    """The wait before ``attempt`` (2 = the first retry): ``delays`` in order, the last one
    repeating (``retries.batch_retry_delay_s``); none before the first attempt."""
    if attempt <= 1:
        return 0.0
    return delays[min(attempt - 2, len(delays) - 1)]


@task(
    name="generate",
    task_run_name="generate[{spec.partition}/{spec.index:04d}]",
    retries=2,  # the partition flow sets this from config.retries (with_options)
    # The wait before a retry happens in the task body (see generate_batch), not in Prefect.
    retry_delay_seconds=0,
    retry_condition_fn=retry_if_it_can_help,
    cache_policy=NO_CACHE,  # results live in Parquet; the batch marker is the cache
    persist_result=False,
)
async def generate_batch(runner: PartitionRunner, spec: BatchSpec) -> BatchSummary | State[Any]:
    """Parse, render, generate, validate and write one batch (skipped if already committed);
    Cancelled (not Crashed) when the run is stopped meanwhile: its requests are aborted and
    nothing of it is committed, so a rerun does it again.

    A retry first waits ``retries.batch_retry_delay_s`` here, in the task's own code, rather
    than in Prefect's AwaitingRetry: a stop during Prefect's wait would end the task Crashed
    (the cancellation lands in the engine), while here it ends Cancelled like any batch."""
    stop = current_stop()
    stopped = f"{spec.label}: the run was stopped; a rerun generates this batch"
    try:
        attempt = prefect.runtime.task_run.run_count
        if stop is not None and stop.requested:  # a retry that the stop caught as it began
            return cancelled(stopped)
        delay = retry_delay_s(runner.retries.batch_retry_delay_s, attempt)
        if delay > 0:
            get_run_logger().info("%s: retry %d in %.0f s", spec.label, attempt - 1, delay)
            await asyncio.sleep(delay)
        return await runner.run_batch(spec)
    except asyncio.CancelledError:
        return cancelled(stopped)
    except Exception as err:
        if stop is not None and stop.requested:  # requests the stop aborted: not a failure
            return cancelled(stopped)
        raise BatchTaskFailed(batch_failure_message(spec.label, spec.partition, err)) from err
