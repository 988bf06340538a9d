"""The parent flow: one server session, one subflow per partition (concurrently), a manifest."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import time
from typing import Any

from prefect import flow, get_run_logger
from prefect.artifacts import acreate_markdown_artifact, acreate_table_artifact
from prefect.client.schemas.objects import FlowRun
from prefect.context import get_run_context
from prefect.events import emit_event
from prefect.flows import Flow
from prefect.states import State

from eagle3_datagen.config import PipelineConfig, ThroughputAlarm
from eagle3_datagen.errors import RunFailed
from eagle3_datagen.generate.context import RunContext
from eagle3_datagen.generate.plan import load_tokenizer
from eagle3_datagen.provenance import build_fingerprint, parquet_metadata
from eagle3_datagen.report.throughput import (
    RunMeter,
    ThroughputChange,
    ThroughputWatch,
    sample_interval,
)
from eagle3_datagen.report.ui import (
    SUMMARY_KEY,
    THROUGHPUT_KEY,
    failed_partition_entry,
    failure_reason,
    run_failure_message,
    stopped_reason,
    summary_description,
    summary_rows,
    throughput_event,
    throughput_log_line,
    throughput_markdown,
)
from eagle3_datagen.sglang.orphans import kill_recorded
from eagle3_datagen.sglang.process import server_state_dir
from eagle3_datagen.sglang.session import open_server
from eagle3_datagen.write.guard import guard_output
from eagle3_datagen.write.manifest import update_manifest
from flows.partition import generate_partition
from flows.secrets import api_key_for


def _stop_server_hook(flow: Flow[Any, Any], flow_run: FlowRun, state: State[Any]) -> None:
    """on_cancellation/on_crashed: may run in another process, so kill by the pidfile."""
    params = flow_run.parameters or {}
    cfg = params.get("config")
    output_dir = (
        cfg.get("output_dir") if isinstance(cfg, dict) else getattr(cfg, "output_dir", None)
    )
    if output_dir:
        kill_recorded(server_state_dir(output_dir), str(flow_run.id))


async def _announce(change: ThroughputChange, flow_run: FlowRun, logger: Any) -> None:
    """A throughput transition as a log line, a Prefect event and a markdown artifact."""
    if change.kind == "low":
        logger.warning(throughput_log_line(change))
    else:
        logger.info(throughput_log_line(change))
    emit_event(
        **throughput_event(
            change,
            flow_run_id=str(flow_run.id),
            flow_run_name=flow_run.name,
            flow_id=str(flow_run.flow_id),
            deployment_id=str(flow_run.deployment_id) if flow_run.deployment_id else None,
        )
    )
    await acreate_markdown_artifact(
        throughput_markdown(change, flow_run.name),
        key=THROUGHPUT_KEY,
        description=change.summary(),
    )


async def _watch_throughput(alarm: ThroughputAlarm, meter: RunMeter, flow_run: FlowRun) -> None:
    """Sample the run's output tokens until cancelled; announce each ok/low transition."""
    watch = ThroughputWatch.from_config(alarm, time.monotonic())
    if watch is None:
        return
    logger = get_run_logger()
    while True:
        await asyncio.sleep(sample_interval(alarm.window_s))
        change = watch.observe(time.monotonic(), meter.total_tokens())
        if change is not None:
            try:
                await _announce(change, flow_run, logger)
            except Exception as err:  # an alarm must never break the run it watches
                logger.warning(f"throughput alarm could not be published: {err}")


async def _publish_summary(
    config: PipelineConfig,
    names: list[str],
    completed: dict[str, dict[str, Any]],
    errors: dict[str, str],
    meter: RunMeter,
) -> None:
    """The run summary table artifact: one row per partition."""
    rows = summary_rows(config.output_dir, names, completed, errors, meter)
    await acreate_table_artifact(
        rows, key=SUMMARY_KEY, description=summary_description(rows, config.output_dir)
    )


@flow(
    name="eagle3-datagen",
    on_cancellation=[_stop_server_hook],
    on_crashed=[_stop_server_hook],
)
async def datagen(
    config: PipelineConfig,
    partitions: list[str] | None = None,
    server_url: str | None = None,
    overwrite: bool = False,
) -> dict[str, Any]:
    """Generate EAGLE-3 training data (exact SGLang token ids) for the selected partitions.

    Args:
        config: The pipeline configuration (same schema as the YAML files in configs/).
        partitions: Names of the partitions to run; empty runs all of them.
        server_url: Attach to this running SGLang server instead of launching one (several:
            comma-separated URLs).
        overwrite: Delete data in the output directory made with other settings.
    """
    logger = get_run_logger()
    names = partitions or [p.name for p in config.partitions]
    for name in names:
        config.partition(name)  # unknown names fail before anything starts
    flow_run = get_run_context().flow_run  # type: ignore[union-attr]
    assert flow_run is not None
    run_key = str(flow_run.id)
    worker = os.environ.get("PREFECT__WORKER_NAME", "none")
    logger.info(f"running on host {socket.gethostname()}, pid {os.getpid()}, worker {worker}")
    tokenizer = load_tokenizer(config)
    meter = RunMeter()
    completed: dict[str, dict[str, Any]] = {}
    errors: dict[str, str] = {}
    try:
        async with open_server(
            config,
            run_key=run_key,
            logger=logger,
            server_url=server_url,
            api_key=await api_key_for(config.server),
        ) as srv:
            fingerprint = build_fingerprint(
                config, tokenizer, srv.facts.server_args, srv.facts.version
            )
            deleted = guard_output(config.output_dir, fingerprint, names, overwrite=overwrite)
            if deleted:
                logger.warning(deleted)
            run = RunContext(
                run_key=run_key, budget=srv.budget, supervisor=srv.supervisor, meter=meter
            )
            update_manifest(config.output_dir, fingerprint, {}, running=True)
            results: dict[str, dict[str, Any]] = {}
            watcher = asyncio.create_task(_watch_throughput(config.throughput, meter, flow_run))
            try:
                states = await asyncio.gather(
                    *(
                        generate_partition(
                            config=config,
                            partition=name,
                            server_url=srv.url,
                            context_length=srv.facts.context_length,
                            max_req_input_len=srv.facts.max_req_input_len,
                            parquet_metadata=parquet_metadata(fingerprint),
                            run=run,
                            return_state=True,
                        )
                        for name in names
                    )
                )
            finally:
                watcher.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await watcher

        for name, state in zip(names, states, strict=True):
            if state.is_completed():
                completed[name] = results[name] = {**await state.aresult(), "status": "completed"}
            else:
                errors[name] = failure_reason(state.message, state.type.value)
                results[name] = failed_partition_entry(name, state.type.value, state.message)
        manifest = update_manifest(config.output_dir, fingerprint, results)
    except BaseException as err:
        stopped = stopped_reason(err)
        for name in names:
            if name not in completed:
                errors.setdefault(name, stopped)
        raise
    finally:
        try:
            await _publish_summary(config, names, completed, errors, meter)
        except Exception as err:
            logger.warning(f"run summary artifact not written: {err}")
    if errors:
        raise RunFailed(run_failure_message(errors, len(names)))
    return manifest
