"""The unit of work the dashboard shows: one batch of one partition."""

from __future__ import annotations

from prefect import task
from prefect.cache_policies import NO_CACHE

from eagle3_datagen.errors import BatchTaskFailed
from eagle3_datagen.generate.batch import PartitionRunner
from eagle3_datagen.inputs.prompts import BatchSpec
from eagle3_datagen.report.ui import batch_failure_message
from eagle3_datagen.write.shards import BatchSummary


@task(
    name="generate",
    task_run_name="generate[{spec.partition}/{spec.index:04d}]",
    retries=2,  # the partition flow sets these from config.retries (with_options)
    retry_delay_seconds=[10, 60],
    cache_policy=NO_CACHE,  # results live in Parquet; the batch marker is the cache
    persist_result=False,
)
async def generate_batch(runner: PartitionRunner, spec: BatchSpec) -> BatchSummary:
    """Parse, render, generate, validate and write one batch (skipped if already committed)."""
    try:
        return await runner.run_batch(spec)
    except Exception as err:
        raise BatchTaskFailed(batch_failure_message(spec.label, spec.partition, err)) from err
