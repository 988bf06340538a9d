"""One partition as a subflow: its own tier, client and progress; batches as tasks."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any
from uuid import UUID

import prefect.runtime
from prefect import flow, get_run_logger
from prefect.artifacts import (
    acreate_progress_artifact,
    acreate_table_artifact,
    aupdate_progress_artifact,
)
from prefect.states import State

from eagle3_datagen.config import PipelineConfig
from eagle3_datagen.errors import PartitionFailed
from eagle3_datagen.generate.batch import PartitionRunner, connect_partition
from eagle3_datagen.generate.context import PartitionJob, RunContext
from eagle3_datagen.generate.plan import PartitionPlan, plan_partition
from eagle3_datagen.generate.windowed import run_windowed
from eagle3_datagen.inputs.near_dups import similar_summary
from eagle3_datagen.inputs.prompts import BatchSpec
from eagle3_datagen.report.progress import Progress
from eagle3_datagen.report.ui import (
    FAILED_BATCHES_PREFIX,
    failed_batch_row,
    failed_batches_description,
    partition_failure_message,
    partition_plan_line,
    partition_run_name,
    partition_summary,
    progress_percent,
)
from eagle3_datagen.write.resume import drop_superseded, reuse_line, superseded_line
from eagle3_datagen_flows import expected_failures
from eagle3_datagen_flows.failed_batches import supersede_partition
from eagle3_datagen_flows.prefect_text import artifact_key
from eagle3_datagen_flows.secrets import api_key_for
from eagle3_datagen_flows.stopping import cancel_left_behind, cancelled, flow_body
from eagle3_datagen_tasks.batch import generate_batch

PROGRESS_EVERY_S = 10.0
# How long the last word waits for an update already on its way (a Prefect API that is away
# can hold one through its client's retries): then it is cancelled.
REPORTER_STOP_S = 15.0


async def _report_progress(
    partition: str, progress: Progress, artifact_id: UUID, every_s: float, stop: asyncio.Event
) -> None:
    """Log the seed's progress line and update the progress artifact until ``stop`` is set.

    An update that fails (the Prefect API away longer than its client retries) is skipped, not
    fatal: the reporter must outlive a Prefect server restart.
    """
    logger = get_run_logger()
    while True:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), every_s)
        if stop.is_set():
            return
        logger.info(f"{partition}: {progress.line()}")
        try:
            await aupdate_progress_artifact(
                artifact_id,
                progress_percent(progress.done, progress.total_lines),
                description=f"{partition}: {progress.line()}",
            )
        except Exception as err:
            logger.warning(f"{partition}: progress artifact not updated: {err}")


def _failed_rows(batches: list[BatchSpec], results: list[Any], progress: Progress) -> list[Any]:
    """The partition's failed batches: batch, first and last line, cause, attempts."""
    return [
        failed_batch_row(
            spec.label, spec.first_line, spec.count, result, progress.attempts.get(spec.index, 1)
        )
        for spec, result in zip(batches, results, strict=True)
        if isinstance(result, BaseException)
    ]


async def _plan(config: PipelineConfig, partition: str, logger: Any) -> PartitionPlan:
    """The partition's plan, made off the event loop (loading the tokenizer and scanning the
    input take seconds, and the other partitions' subflows start on this loop meanwhile)."""
    tier = config.tier(config.partition(partition).tier)
    plan = await asyncio.to_thread(plan_partition, config, partition)
    logger.info(
        partition_plan_line(
            partition,
            plan.total_lines,
            len(plan.batches),
            tier.name,
            tier.concurrency,
            tier.max_tokens,
        )
    )
    if plan.duplicates:
        logger.warning(f"{partition}: {len(plan.duplicates)} lines repeat an earlier id; rejected")
    if plan.similar:
        part = config.partition(partition)
        policy = part.near_duplicates.policy
        logger.warning(similar_summary(partition, part.input, plan.similar, policy))
    if plan.superseded:
        logger.warning(superseded_line(partition, plan.superseded, len(plan.reuse)))
    if plan.done_lines:  # a rerun: what it keeps and what is left
        logger.info(reuse_line(partition, plan.done_lines, plan.total_lines, len(plan.reuse)))
    return plan


@contextlib.asynccontextmanager
async def _reporting(partition: str, progress: Progress) -> AsyncIterator[None]:
    """The partition's progress artifact and log line, every PROGRESS_EVERY_S while the block
    runs, and a last word when it ends (also for runs shorter than one period)."""
    artifact_id = await acreate_progress_artifact(
        0.0, key=artifact_key("progress", partition), description=f"{partition}: starting"
    )
    stop = asyncio.Event()
    reporter = asyncio.create_task(
        _report_progress(partition, progress, artifact_id, PROGRESS_EVERY_S, stop)
    )
    try:
        yield
    finally:
        # The partition's clock stops here, so its last line and the run's summary (written
        # later) show one tok/s, not two readings of a clock still running; lines left now (a
        # failed or cancelled partition) get no ETA.
        progress.end()
        # An update on its way finishes before the last one is sent: cancelled mid-request, it
        # could reach the server after the last one and leave the artifact an earlier reading.
        stop.set()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await asyncio.wait_for(reporter, REPORTER_STOP_S)
        with contextlib.suppress(Exception):
            await aupdate_progress_artifact(
                artifact_id,
                progress_percent(progress.done, progress.total_lines),
                description=f"{partition}: {progress.line()}",
            )


async def _run_batches(
    config: PipelineConfig, plan: PartitionPlan, runner: PartitionRunner
) -> list[Any]:
    """Every batch as a task run (with the config's batch retries), ``plan.window`` at a time;
    a result per batch, an exception for one that failed after its retries."""
    # The delays between retries are waited in the task body (tasks/batch.py).
    batch_task = generate_batch.with_options(retries=config.retries.batch_retries)

    async def _batch(spec: Any) -> Any:
        runner.raise_if_server_lost()  # no task run for a batch that cannot succeed
        done = await runner.committed_before(spec)
        if done is not None:  # an earlier run's or attempt's: no task run that does nothing
            return done
        # Named for its batch from the start: Prefect names a task run '<task name>-<3 hex>'
        # until it starts, which is all a batch cancelled before it started would show.
        named = batch_task.with_options(name=f"generate[{spec.label}]")
        result = await named(runner, spec)
        if isinstance(result, State):  # the task ended Cancelled: the stop goes on
            raise asyncio.CancelledError
        return result

    return await run_windowed(iter(plan.batches), _batch, plan.window)


def _subflow_name() -> str:
    """``partition-<name> <date>``: the partition, and when it started (UTC)."""
    when = prefect.runtime.flow_run.scheduled_start_time or datetime.now(UTC)
    return partition_run_name(prefect.runtime.flow_run.parameters["partition"], when)


@flow(name="datagen-partition", flow_run_name=_subflow_name, log_prints=True)
async def generate_partition(
    config: PipelineConfig,
    partition: str,
    server_url: str,
    context_length: int | None = None,
    max_req_input_len: int | None = None,
    parquet_metadata: dict[str, str] | None = None,
    run: RunContext | None = None,
) -> dict[str, Any]:
    """Generate one partition's records; fails if any batch failed after its retries.

    ``run`` carries the parent run's server budget, supervisor and meter; without it (a
    partition run on its own) the config's limits apply and no supervisor watches the server.
    Stopped (Ctrl-C, Cancel), it ends Cancelled once its batches in flight have.
    """
    expected_failures.install()  # a batch out of retries: one ERROR line, no traceback
    async with flow_body() as stop:
        job = PartitionJob(
            config, partition, server_url, context_length, max_req_input_len, parquet_metadata, run
        )
        try:
            return await _generate(job)
        except BaseException as err:
            # A stop that reached a batch as an error (its requests aborted) is a stop too.
            if not isinstance(err, asyncio.CancelledError) and not stop.requested:
                raise
            message = f"{partition}: the run was stopped before this partition finished"
            state = cancelled(message)
            with contextlib.suppress(Exception):  # a state's wording never fails the stop
                await cancel_left_behind(
                    prefect.runtime.flow_run.id,
                    f"{partition}: the run was stopped before this batch finished; a rerun "
                    "generates it",
                    stop.at,
                )
            return state  # type: ignore[return-value]


async def _generate(job: PartitionJob) -> dict[str, Any]:
    """The partition's records: plan, client, batches, its failed-batches table."""
    logger = get_run_logger()
    config, partition = job.config, job.partition
    run = job.run
    if run is None:
        run = RunContext.standalone(config, run_key=str(prefect.runtime.flow_run.id))
        job = dataclasses.replace(job, run=run)
        logger.info(f"{partition}: standalone run: no server supervisor")
    plan = await _plan(config, partition, logger)
    api_key = await api_key_for(config.server)
    async with connect_partition(config, partition, job.server_url, api_key) as client:
        runner = PartitionRunner.from_plan(plan, job, client)  # rids name the flow run
        progress = runner.progress
        progress.total_lines = plan.total_lines
        run.meter.track(partition, progress)
        try:
            async with _reporting(partition, progress):
                results = await _run_batches(config, plan, runner)
        finally:
            run.meter.finish(partition)
    logger.info(f"{partition}: {progress.line()}")
    failures = [r for r in results if isinstance(r, BaseException)]
    if failures:
        rows = _failed_rows(plan.batches, results, progress)
        table_id = None
        try:
            table_id = await acreate_table_artifact(
                rows,
                key=artifact_key(FAILED_BATCHES_PREFIX, partition),
                description=failed_batches_description(partition, rows, len(plan.batches)),
            )
        except Exception as err:  # the table is a convenience; the state message says it all
            logger.warning(f"{partition}: failed-batches artifact not written: {err}")
        # The rows go to the parent with the error: its own table lists every partition's.
        message = partition_failure_message(partition, failures, len(plan.batches))
        raise PartitionFailed(message, rows=rows, table_id=table_id)
    drop_superseded(runner.output)  # every batch is committed: nothing left to reuse
    try:  # an earlier run's failed-batches table of this partition is now out of date
        by = f"{prefect.runtime.flow_run.name} (flow run {prefect.runtime.flow_run.id})"
        await supersede_partition(partition, config.output_dir, by)
    except Exception as err:
        logger.warning(f"{partition}: earlier failed-batches artifacts not marked: {err}")
    return partition_summary(config.output_dir, partition, progress)
