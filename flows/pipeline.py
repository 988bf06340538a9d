"""The parent flow: one server session, one subflow per partition (concurrently), a manifest."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import time
from datetime import UTC, datetime
from typing import Any
from uuid import UUID

from prefect import flow, get_run_logger, tags
from prefect.artifacts import (
    acreate_markdown_artifact,
    acreate_progress_artifact,
    acreate_table_artifact,
    aupdate_progress_artifact,
)
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import (
    ArtifactFilter,
    ArtifactFilterFlowRunId,
    ArtifactFilterKey,
)
from prefect.client.schemas.objects import FlowRun
from prefect.context import get_run_context
from prefect.events import emit_event
from prefect.flows import Flow
from prefect.runtime import deployment as current_deployment
from prefect.runtime import flow_run as current_run
from prefect.settings import PREFECT_UI_URL
from prefect.states import State

from eagle3_datagen.config import PipelineConfig, ThroughputAlarm
from eagle3_datagen.errors import OutputWriteError, RunFailed, ServerLost
from eagle3_datagen.generate.context import RunContext
from eagle3_datagen.precheck import check_before_server
from eagle3_datagen.provenance import build_fingerprint, parquet_metadata
from eagle3_datagen.report.data_picture import (
    picture_description,
    picture_markdown,
)
from eagle3_datagen.report.dataset_card import refresh_dataset_card
from eagle3_datagen.report.probe import Baseline, ThroughputProbe
from eagle3_datagen.report.throughput import (
    RunMeter,
    ThroughputChange,
    ThroughputWatch,
    sample_interval,
)
from eagle3_datagen.report.ui import (
    DATA_PREFIX,
    FAILED_BATCHES_PREFIX,
    RUN_PROGRESS_KEY,
    SUMMARY_KEY,
    THROUGHPUT_KEY,
    failed_partition_entry,
    progress_percent,
    run_failure_message,
    run_name,
    run_progress_markdown,
    stopped_reason,
    summary_description,
    summary_rows,
    throughput_log_line,
    throughput_markdown,
)
from eagle3_datagen.sglang.orphans import kill_recorded
from eagle3_datagen.sglang.process import server_state_dir
from eagle3_datagen.sglang.session import open_server
from eagle3_datagen.write.guard import guard_output
from eagle3_datagen.write.manifest import update_manifest
from eagle3_datagen_flows.partition import PROGRESS_EVERY_S, generate_partition
from eagle3_datagen_flows.prefect_text import (
    artifact_key,
    artifact_link,
    failure_reason,
    throughput_event,
)
from eagle3_datagen_flows.secrets import api_key_for


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


async def _watch_throughput(
    alarm: ThroughputAlarm, meter: RunMeter, flow_run: FlowRun, probed: list[Baseline]
) -> None:
    """Sample the run's output tokens until cancelled; announce each ok/low transition.

    Without an expected rate, the run's own rate after the warm-up becomes the baseline
    (logged, appended to ``probed`` for the summary)."""
    start = time.monotonic()
    watch = ThroughputWatch.from_config(alarm, start)
    probe = ThroughputProbe.from_config(alarm, start)
    if watch is None and probe is None:
        return
    logger = get_run_logger()
    while True:
        await asyncio.sleep(sample_interval(alarm.window_s))
        now = time.monotonic()
        if watch is None:
            assert probe is not None
            baseline = probe.observe(now, meter.total_tokens())
            if baseline is not None:
                logger.info(baseline.summary())
                probed.append(baseline)
                watch = probe.watch(alarm, now)
            continue
        change = watch.observe(now, meter.total_tokens())
        if change is not None:
            try:
                await _announce(change, flow_run, logger)
            except Exception as err:  # an alarm must never break the run it watches
                logger.warning(f"throughput alarm could not be published: {err}")


async def _watch_progress(meter: RunMeter, artifact_id: UUID, states: dict[str, str]) -> None:
    """Update the parent's progress artifact (all partitions, one table) until cancelled.

    A failed update (the Prefect API away longer than its client retries) is skipped.
    """
    while True:
        await asyncio.sleep(PROGRESS_EVERY_S)
        try:
            await _update_progress(meter, artifact_id, states)
        except Exception as err:
            get_run_logger().warning(f"run progress artifact not updated: {err}")


async def _update_progress(meter: RunMeter, artifact_id: UUID, states: dict[str, str]) -> None:
    done, total = meter.totals()
    await aupdate_progress_artifact(
        artifact_id, progress_percent(done, total), description=run_progress_markdown(meter, states)
    )


async def _partition(name: str, tier: str, parent_tags: list[str], **kwargs: Any) -> State[Any]:
    """One partition's subflow, tagged with its partition, its tier and the parent's tags."""
    with tags(*parent_tags, f"partition:{name}", f"tier:{tier}"):
        state: State[Any] = await generate_partition(partition=name, return_state=True, **kwargs)
    return state


async def _failed_batch_links(states: dict[str, State[Any]]) -> dict[str, tuple[int, str]]:
    """Per failed partition: (failed batches, link to its failed-batches table artifact)."""
    links: dict[str, tuple[int, str]] = {}
    ui_url = PREFECT_UI_URL.value()
    async with get_client() as client:
        for name, state in states.items():
            sub_id = state.state_details.flow_run_id
            if state.is_completed() or sub_id is None:
                continue
            found = await client.read_artifacts(
                artifact_filter=ArtifactFilter(
                    key=ArtifactFilterKey(any_=[artifact_key(FAILED_BATCHES_PREFIX, name)]),
                    flow_run_id=ArtifactFilterFlowRunId(any_=[sub_id]),
                ),
                limit=1,
            )
            if found:
                data = found[0].data
                rows = json.loads(data) if isinstance(data, str) else data
                links[name] = (len(rows or []), artifact_link(ui_url, str(found[0].id)))
    return links


async def _publish_data(config: PipelineConfig, manifest: dict[str, Any], names: list[str]) -> None:
    """Per partition of this run a data-picture artifact; the dataset card for the directory."""
    pictures = refresh_dataset_card(config.output_dir, manifest)
    for name in names:
        picture = pictures.get(name)
        if picture is not None:
            await acreate_markdown_artifact(
                picture_markdown(picture),
                key=artifact_key(DATA_PREFIX, name),
                description=picture_description(picture),
            )


def _run_name() -> str:
    """What ran: the deployment (or output directory), the partitions, when (UTC)."""
    params = current_run.parameters
    return run_name(
        current_deployment.name, params.get("config"), params.get("partitions"), datetime.now(UTC)
    )


@flow(
    name="eagle3-datagen",
    flow_run_name=_run_name,
    on_cancellation=[_stop_server_hook],
    on_crashed=[_stop_server_hook],
)
async def datagen(
    partitions: list[str] | None = None,
    server_url: str | None = None,
    overwrite: bool = False,
    *,
    config: PipelineConfig,
) -> dict[str, Any]:
    """Generate EAGLE-3 training data (exact SGLang token ids) for the selected partitions.

    Args:
        partitions: Names of the partitions to run; empty runs all of them.
        server_url: Attach to this running SGLang server instead of launching one (several:
            comma-separated URLs).
        overwrite: Delete data in the output directory made with other settings.
        config: The pipeline configuration (same schema as the YAML files in configs/).
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
    meter = RunMeter()
    states: dict[str, str] = {}
    completed: set[str] = set()
    errors: dict[str, str] = {}
    lost: str | None = None  # the ServerLost message when the server went for good
    failed_links: dict[str, tuple[int, str]] = {}
    progress_id: UUID | None = None
    probed: list[Baseline] = []  # the throughput probe's baseline, once measured
    try:
        # Inputs, tokenizer and special tokens before the server: a model load takes minutes.
        check = check_before_server(config, names, sizes=meter.sizes)
        progress_id = await acreate_progress_artifact(
            0.0, key=RUN_PROGRESS_KEY, description=run_progress_markdown(meter, states)
        )
        async with open_server(
            config,
            run_key=run_key,
            logger=logger,
            server_url=server_url,
            api_key=await api_key_for(config.server),
        ) as srv:
            fingerprint = build_fingerprint(
                config, check.tokenizer, srv.facts.server_args, srv.facts.version
            )
            deleted = guard_output(config.output_dir, fingerprint, names, overwrite=overwrite)
            if deleted:
                logger.warning(deleted)
            run = RunContext(
                run_key=run_key, budget=srv.budget, supervisor=srv.supervisor, meter=meter
            )
            update_manifest(config.output_dir, fingerprint, {}, running=True)
            results: dict[str, dict[str, Any]] = {}
            watchers = [
                asyncio.create_task(_watch_throughput(config.throughput, meter, flow_run, probed)),
                asyncio.create_task(_watch_progress(meter, progress_id, states)),
            ]
            parent_tags = sorted(flow_run.tags or [])
            states.update({name: "running" for name in names})
            try:
                final = await asyncio.gather(
                    *(
                        _partition(
                            name,
                            config.partition(name).tier,
                            parent_tags,
                            config=config,
                            server_url=srv.url,
                            context_length=srv.facts.context_length,
                            max_req_input_len=srv.facts.max_req_input_len,
                            parquet_metadata=parquet_metadata(fingerprint),
                            run=run,
                        )
                        for name in names
                    )
                )
            finally:
                for watcher in watchers:
                    watcher.cancel()
                    with contextlib.suppress(asyncio.CancelledError, Exception):
                        await watcher
            # A server lost for good stopped every partition: that is the run's one reason.
            lost = srv.supervisor.failed if srv.supervisor is not None else None

        by_name = dict(zip(names, final, strict=True))
        for name, state in by_name.items():
            states[name] = state.type.value.lower()
            if state.is_completed():
                completed.add(name)
                results[name] = {**await state.aresult(), "status": "completed"}
            else:
                errors[name] = failure_reason(state.message, state.type.value)
                results[name] = failed_partition_entry(name, state.type.value, state.message)
        try:
            manifest = update_manifest(config.output_dir, fingerprint, results)
        except (OSError, OutputWriteError) as err:
            if not errors and lost is None:
                raise
            # A full disk fails the shard first, then the manifest: the shard's error is the
            # run's reason, the manifest's only a consequence (a rerun rewrites it).
            logger.warning(f"manifest not updated: {err}")
            manifest = {}
        try:
            failed_links = await _failed_batch_links(by_name)
            await _publish_data(config, manifest, names)
        except Exception as err:  # reports must never fail a run that generated its data
            logger.warning(f"data picture or dataset card not written: {err}")
    except BaseException as err:
        stopped = stopped_reason(err)
        for name in names:
            if name not in completed:
                errors.setdefault(name, stopped)
        raise
    finally:
        try:
            rows = summary_rows(config.output_dir, names, completed, errors, meter, failed_links)
            description = summary_description(rows, config.output_dir)
            await acreate_table_artifact(
                rows, key=SUMMARY_KEY, description="; ".join([description, *map(str, probed)])
            )
            if progress_id is not None:
                for name in names:
                    states.setdefault(name, "not run")
                    if states[name] == "running":
                        states[name] = "failed" if name in errors else "not run"
                await _update_progress(meter, progress_id, states)
        except Exception as err:
            logger.warning(f"run summary artifact not written: {err}")
    if lost is not None:
        raise ServerLost(lost)
    if errors:
        raise RunFailed(run_failure_message(errors, len(names)))
    return manifest
