"""The parent flow: one server session, one subflow per partition (concurrently), a manifest."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import socket
import time
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger
from prefect.artifacts import acreate_markdown_artifact, acreate_table_artifact
from prefect.client.schemas.objects import FlowRun
from prefect.context import get_run_context
from prefect.events import emit_event
from prefect.flows import Flow
from prefect.states import State

from eagle3_datagen.config import PipelineConfig, ThroughputAlarm
from eagle3_datagen.errors import ConfigError
from eagle3_datagen.provenance import build_fingerprint, diff_content, parquet_metadata
from eagle3_datagen.render.chat_tokenizer import ChatTokenizer
from eagle3_datagen.report.throughput import (
    RunMeter,
    ThroughputChange,
    ThroughputWatch,
    sample_interval,
)
from eagle3_datagen.report.ui import (
    SUMMARY_KEY,
    THROUGHPUT_KEY,
    failure_reason,
    run_failure_message,
    summary_description,
    summary_row,
    throughput_markdown,
)
from eagle3_datagen.sglang.orphans import kill_recorded
from eagle3_datagen.sglang.process import server_state_dir
from eagle3_datagen.sglang.session import open_server
from eagle3_datagen.write.manifest import read_manifest, summarize, update_manifest
from eagle3_datagen.write.shards import PartitionOutput
from flows.partition import RUN_METERS, generate_partition
from flows.secrets import api_key_for

EVENT_PREFIX = "eagle3-datagen.throughput"


class RunFailed(Exception):
    """Some partitions failed; the message names each and why."""


def _stop_server_hook(flow: Flow[Any, Any], flow_run: FlowRun, state: State[Any]) -> None:
    """on_cancellation/on_crashed: may run in another process, so kill by the pidfile."""
    params = flow_run.parameters or {}
    cfg = params.get("config")
    output_dir = (
        cfg.get("output_dir") if isinstance(cfg, dict) else getattr(cfg, "output_dir", None)
    )
    if output_dir:
        kill_recorded(server_state_dir(output_dir), str(flow_run.id))


def _guard_output(
    config: PipelineConfig, fingerprint: dict[str, Any], overwrite: bool, logger: Any
) -> None:
    """Refuse to mix this run's data with data made under another fingerprint.

    With ``overwrite`` the old data of the configured partitions is deleted instead, so that
    no batch made under the old fingerprint is mistaken for done.
    """
    output_dir = config.output_dir
    old = read_manifest(output_dir)
    if old is None:
        return
    old_fp = old.get("fingerprint", {})
    if old_fp.get("content_sha256") == fingerprint["content_sha256"]:
        return
    changes = diff_content(old_fp.get("content", {}), fingerprint["content"])
    if overwrite:
        logger.warning(f"--overwrite: deleting data made with other settings ({changes[:3]})")
        for part in config.partitions:
            shutil.rmtree(Path(output_dir) / part.name, ignore_errors=True)
        return
    raise ConfigError(
        f"{output_dir} holds data made with different settings; changed: "
        + "; ".join(changes[:10])
        + ". Use a new output directory or --overwrite."
    )


async def _announce(change: ThroughputChange, flow_run: FlowRun, logger: Any) -> None:
    """A throughput transition as a log line, a Prefect event and a markdown artifact."""
    if change.kind == "low":
        logger.warning(f"throughput alarm: {change.summary()}")
    else:
        logger.info(f"throughput alarm cleared: {change.summary()}")
    related = [{"prefect.resource.id": f"prefect.flow.{flow_run.flow_id}",
                "prefect.resource.role": "flow"}]  # fmt: skip
    if flow_run.deployment_id:
        related.append({"prefect.resource.id": f"prefect.deployment.{flow_run.deployment_id}",
                        "prefect.resource.role": "deployment"})  # fmt: skip
    emit_event(
        event=f"{EVENT_PREFIX}.{change.kind}",
        resource={
            "prefect.resource.id": f"prefect.flow-run.{flow_run.id}",
            "prefect.resource.name": flow_run.name,
            "prefect.resource.role": "flow-run",
        },
        related=related,
        payload=change.payload(),
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
    """The run summary table artifact: one row per partition, unfinished ones from disk."""
    rows = []
    for name in names:
        if name in completed:
            rows.append(summary_row(name, "completed", completed[name]))
            continue
        on_disk = summarize(name, PartitionOutput(config.output_dir, name).batch_summaries())
        status = "failed" if name in errors else "not run"
        rows.append(summary_row(name, status, on_disk, meter.timing(name), errors.get(name)))
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
    tokenizer = ChatTokenizer(
        config.model.tokenizer_dir,
        trust_remote_code=config.model.trust_remote_code,
        chat_template_kwargs=config.model.chat_template_kwargs,
    )
    meter = RUN_METERS[run_key] = RunMeter()
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
            _guard_output(config, fingerprint, overwrite, logger)
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
                            supervisor_key=srv.supervisor_key,
                            run_key=run_key,
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
                results[name] = {"partition": name, "status": state.type.value.lower(),
                                 "error": state.message}  # fmt: skip
        manifest = update_manifest(config.output_dir, fingerprint, results)
    except BaseException as err:
        stopped = f"run stopped before it finished: {str(err) or type(err).__name__}"
        for name in names:
            if name not in completed:
                errors.setdefault(name, stopped)
        raise
    finally:
        RUN_METERS.pop(run_key, None)
        try:
            await _publish_summary(config, names, completed, errors, meter)
        except Exception as err:
            logger.warning(f"run summary artifact not written: {err}")
    if errors:
        raise RunFailed(run_failure_message(errors, len(names)))
    return manifest
