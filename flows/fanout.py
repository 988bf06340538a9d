"""Partitions across machines: one partition job per partition, run by a work pool's workers.

Each job is a run of the ``eagle3-datagen`` deployment with one partition: the worker that
picks it up launches its own SGLang server on its own GPUs, and all jobs write to one shared
output directory (a shared filesystem). Prefect's work pool is the scheduler: add GPU nodes by
starting workers on them. A retried fan-out finds its finished jobs by idempotency key and runs
only the ones that did not complete.
"""

from __future__ import annotations

import asyncio
from typing import Any

from prefect import flow, get_run_logger
from prefect.client.schemas.objects import FlowRun
from prefect.context import get_run_context
from prefect.deployments.flow_runs import arun_deployment

from eagle3_datagen.config import PipelineConfig
from eagle3_datagen.errors import FanOutFailed
from eagle3_datagen.report.dataset_card import refresh_dataset_card
from eagle3_datagen.report.ui import fanout_failure_message
from eagle3_datagen.write.manifest import settle_manifest
from eagle3_datagen_flows import expected_failures
from eagle3_datagen_flows.pipeline import fanout_run_name
from eagle3_datagen_flows.stopping import cancelled, keep_own_message

PARTITION_DEPLOYMENT = "eagle3-datagen/partition-job"


@flow(
    name="eagle3-datagen-fanout",
    flow_run_name=fanout_run_name,
    on_cancellation=[keep_own_message],
)
async def datagen_fanout(
    config: PipelineConfig,
    partitions: list[str] | None = None,
    deployment: str = PARTITION_DEPLOYMENT,
    overwrite: bool = False,
) -> dict[str, Any]:
    """Run each partition as its own job on the work pool; merge their results.

    Args:
        config: The pipeline configuration; ``output_dir`` must be on a filesystem that every
            worker node shares.
        partitions: Names of the partitions to run; empty runs all of them.
        deployment: The deployment of the ``eagle3-datagen`` flow that runs one partition.
        overwrite: Passed to each job (delete data made with other settings).
    """
    expected_failures.install()  # a failed job: one ERROR line, no traceback
    logger = get_run_logger()
    names = [p.name for p in config.select(partitions)]
    parent = get_run_context().flow_run  # type: ignore[union-attr]
    assert parent is not None
    params = config.model_dump(mode="json")

    async def job(name: str) -> FlowRun:
        key = f"{parent.id}/{name}"
        run = await _run(deployment, params, name, overwrite, key)
        if not _completed(run) and parent.run_count > 1:
            # A retried fan-out: the earlier job of this partition failed, so start a new one.
            run = await _run(deployment, params, name, overwrite, f"{key}/retry-{parent.run_count}")
        return run

    try:
        runs = await asyncio.gather(*(job(n) for n in names))
    except asyncio.CancelledError:  # Ctrl-C: the command line has the jobs' workers stop them
        message = "stopped before its partition jobs finished; a rerun finishes them"
        return cancelled(message)  # type: ignore[return-value]
    failed = {n: r for n, r in zip(names, runs, strict=True) if not _completed(r)}
    for name, run in zip(names, runs, strict=True):
        state = run.state.type.value if run.state else "UNKNOWN"
        logger.info(f"partition {name}: job {run.name} ({run.id}) ended {state}")

    # The jobs wrote their own manifests concurrently; settle the final one from disk.
    manifest = settle_manifest(config.output_dir, names, set(failed))
    if manifest:
        refresh_dataset_card(config.output_dir, manifest, config.serving_profile)
    if failed:
        messages = {n: r.state.message if r.state else None for n, r in failed.items()}
        raise FanOutFailed(fanout_failure_message(messages, len(names)))
    return manifest or {}


async def _run(
    deployment: str, config: dict[str, Any], name: str, overwrite: bool, key: str
) -> FlowRun:
    return await arun_deployment(
        name=deployment,
        parameters={"config": config, "partitions": [name], "overwrite": overwrite},
        idempotency_key=key,
        timeout=None,  # partitions take hours; wait for the job, however long
        poll_interval=5,
        as_subflow=True,
    )


def _completed(run: FlowRun) -> bool:
    return run.state is not None and run.state.is_completed()
