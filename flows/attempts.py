"""What one attempt of a run retried from the UI says and takes from the attempts before it.

A Retry from the dashboard runs the same flow run again (``run_count`` counts the attempts);
Prefect keeps every attempt's subflows, logs and artifacts under the one run. This attempt
says its number where its log lines start (the Logs tab shows every attempt's lines in one
stream, oldest first, and cannot be opened on the latest), and reuses each partition an
earlier attempt completed: its data is on disk, so it gets no new subflow at all. The
attempt's first lines also say where it runs, and its partitions become the run's tags.
"""

from __future__ import annotations

import os
import socket
from typing import Any

from prefect import get_run_logger
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterParentFlowRunId
from prefect.client.schemas.objects import FlowRun
from prefect.context import get_run_context

from eagle3_datagen.report.outcome import RunOutcome
from eagle3_datagen.report.throughput import RunMeter
from eagle3_datagen.report.ui import attempt_line, reused_line
from eagle3_datagen.sglang.health import LogSink
from eagle3_datagen.write.resume import still_on_disk

PARTITION_TAG = "partition:"
TIER_TAG = "tier:"


def shared_tags(run_tags: list[str] | None) -> list[str]:
    """The parent's tags its subflows and batches inherit: the deployment's and a person's,
    never the ``partition:``/``tier:`` tags the parent carries for all its partitions (a
    retried parent's own record has them all)."""
    return sorted(t for t in run_tags or [] if not t.startswith((PARTITION_TAG, TIER_TAG)))


def log_attempt(flow_run: FlowRun, logger: Any) -> None:
    """The attempt's first line: which attempt this is, so the latest is found in the stream."""
    logger.info(attempt_line(flow_run.run_count or 1))


async def completed_earlier(flow_run: FlowRun) -> dict[str, FlowRun]:
    """Per partition, the subflow of an earlier attempt of this run that COMPLETED (the latest
    such); {} on a first attempt."""
    if (flow_run.run_count or 1) <= 1:
        return {}
    async with get_client() as client:
        subs = await client.read_flow_runs(
            flow_run_filter=FlowRunFilter(
                parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=[flow_run.id])
            )
        )
    done: dict[str, FlowRun] = {}
    for sub in sorted(subs, key=lambda s: str(s.start_time or "")):
        name = (sub.parameters or {}).get("partition")
        if isinstance(name, str) and sub.state is not None and sub.state.is_completed():
            done[name] = sub
    return done


async def reuse_completed(
    output_dir: str, names: list[str], flow_run: FlowRun, meter: RunMeter, outcome: RunOutcome
) -> list[str]:
    """A retried run's partitions still to run: those an earlier attempt completed, with their
    data still on disk, are reused (no subflow) and said so in the log, the meter and the
    outcome."""
    logger = get_run_logger()
    try:
        earlier = await completed_earlier(flow_run)
    except Exception as err:  # the API away: run them all, as a first attempt would
        logger.warning(f"earlier attempts not read, every partition runs: {err}")
        return names
    for name, sub in earlier.items():
        on_disk = still_on_disk(output_dir, name, meter.sizes.get(name))
        if name in names and on_disk is not None:
            logger.info(reused_line(name, on_disk, sub.name))
            meter.reused(name, int(on_disk["input_lines"]))
            outcome.partition_reused(name, on_disk)
    return [name for name in names if name not in outcome.reused]


async def this_run(names: list[str], logger: LogSink) -> FlowRun:
    """The flow run, tagged with its partitions (the Runs page filters parents by them too)."""
    flow_run = get_run_context().flow_run  # type: ignore[union-attr]
    assert flow_run is not None
    worker = os.environ.get("PREFECT__WORKER_NAME", "none")
    log_attempt(flow_run, logger)
    logger.info(f"running on host {socket.gethostname()}, pid {os.getpid()}, worker {worker}")
    wanted = sorted({*(flow_run.tags or []), *(f"{PARTITION_TAG}{name}" for name in names)})
    if wanted != sorted(flow_run.tags or []):
        try:
            async with get_client() as client:
                await client.update_flow_run(flow_run.id, tags=wanted)
        except Exception as err:  # a tag is a convenience, never a reason to fail
            logger.warning(f"partition tags not set: {err}")
    return flow_run
