"""The parent flow: one server session, one subflow per partition (concurrently), a manifest.

It reads as the run: check what can be checked before a server, open the server, run the
partitions, write the manifest, report. What the outcome means (which failure is the run's
reason, what each artifact says) is ``eagle3_datagen.report.outcome.RunOutcome``'s to decide.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from prefect import flow, get_run_logger
from prefect.client.schemas.objects import FlowRun
from prefect.context import TagsContext
from prefect.flows import Flow
from prefect.runtime import deployment as current_deployment
from prefect.runtime import flow_run as current_run
from prefect.states import State

from eagle3_datagen.config import PipelineConfig
from eagle3_datagen.errors import OutputWriteError
from eagle3_datagen.generate.context import RunContext
from eagle3_datagen.precheck import RunCheck, check_before_server
from eagle3_datagen.provenance import build_fingerprint, parquet_metadata
from eagle3_datagen.report.dataset_card import WrittenDataset, write_manifest_and_card
from eagle3_datagen.report.outcome import RunOutcome
from eagle3_datagen.report.throughput import RunMeter
from eagle3_datagen.report.ui import keeps_name, run_name
from eagle3_datagen.sglang.health import LogSink
from eagle3_datagen.sglang.orphans import kill_recorded
from eagle3_datagen.sglang.process import server_state_dir
from eagle3_datagen.sglang.session import ServerSession, open_server
from eagle3_datagen.stop import RunStop
from eagle3_datagen.write.guard import guard_output
from eagle3_datagen.write.lock import PartitionLocks
from eagle3_datagen.write.manifest import update_manifest
from eagle3_datagen_flows import expected_failures
from eagle3_datagen_flows.attempts import (
    PARTITION_TAG,
    TIER_TAG,
    reuse_completed,
    shared_tags,
    this_run,
)
from eagle3_datagen_flows.auto_concurrency import emit_limit_changes, publish_limit_changes
from eagle3_datagen_flows.partition import generate_partition
from eagle3_datagen_flows.prefect_text import failure_reason
from eagle3_datagen_flows.run_report import RunReport
from eagle3_datagen_flows.secrets import api_key_for
from eagle3_datagen_flows.stopping import (
    cancel_left_behind,
    flow_body,
    keep_own_message,
    stopped_run,
)


def _stop_server_hook(flow: Flow[Any, Any], flow_run: FlowRun, state: State[Any]) -> None:
    """on_cancellation/on_crashed: may run in another process, so kill by the pidfile."""
    params = flow_run.parameters or {}
    cfg = params.get("config")
    output_dir = (
        cfg.get("output_dir") if isinstance(cfg, dict) else getattr(cfg, "output_dir", None)
    )
    if output_dir:
        kill_recorded(server_state_dir(output_dir), str(flow_run.id))


async def _partition(name: str, tier: str, parent_tags: list[str], **kwargs: Any) -> State[Any]:
    """One partition's subflow, tagged with its partition, its tier and the parent's shared
    tags, nothing else: the tags in force are replaced, not added to, so no other partition's
    tag reaches this subflow or its batch tasks."""
    own = {*shared_tags(parent_tags), f"{PARTITION_TAG}{name}", f"{TIER_TAG}{tier}"}
    with TagsContext(current_tags=own):
        state: State[Any] = await generate_partition(partition=name, return_state=True, **kwargs)
    return state


@dataclass(slots=True)
class _Session:
    """A server that passed its gate, and the run's output checked against it."""

    srv: ServerSession
    fingerprint: dict[str, Any]
    run: RunContext


@asynccontextmanager
async def _session(
    config: PipelineConfig,
    names: list[str],
    check: RunCheck,
    meter: RunMeter,
    flow_run: FlowRun,
    server_url: str | None,
    overwrite: bool,
    logger: LogSink,
) -> AsyncIterator[_Session]:
    """Open (launch or attach) the server, fingerprint the run with what it reports, make the
    output directory fit that fingerprint, and mark the manifest as running."""
    run_key = str(flow_run.id)
    api_key = await api_key_for(config.server)
    async with open_server(
        config, run_key=run_key, logger=logger, server_url=server_url, api_key=api_key
    ) as srv:
        fingerprint = build_fingerprint(
            config, check.tokenizer, srv.facts.server_args, srv.facts.version
        )
        deleted = guard_output(config.output_dir, fingerprint, names, overwrite=overwrite)
        if deleted:
            logger.warning(deleted)
        run = RunContext(run_key=run_key, budget=srv.budget, supervisor=srv.supervisor, meter=meter)
        profile = config.serving_profile  # recorded for coverage DIR; later writes keep it
        update_manifest(config.output_dir, fingerprint, {}, running=True, serving_profile=profile)
        yield _Session(srv, fingerprint, run)


async def _run_partitions(
    config: PipelineConfig,
    names: list[str],
    session: _Session,
    outcome: RunOutcome,
    flow_run: FlowRun,
    stop: RunStop,
    ended: Callable[[], None],
) -> dict[str, State[Any]]:
    """Every partition's subflow, side by side on the run's server; each one's end is recorded
    as it ends (the live progress table shows it then, not when the last partition ends) and
    ``ended`` told. A retried run's partitions that an earlier attempt completed are reused,
    not run again."""
    srv = session.srv
    meter = session.run.meter
    to_run = await reuse_completed(config.output_dir, names, flow_run, meter, outcome)
    outcome.started()

    async def one(name: str) -> State[Any]:
        state = await _partition(
            name,
            config.partition(name).tier,
            flow_run.tags or [],
            config=config,
            server_url=srv.url,
            context_length=srv.facts.context_length,
            max_req_input_len=srv.facts.max_req_input_len,
            parquet_metadata=parquet_metadata(session.fingerprint),
            run=session.run,
        )
        await _record_end(name, state, outcome)
        ended()
        return state

    running = {name: asyncio.ensure_future(one(name)) for name in to_run}
    try:
        final = await asyncio.gather(*running.values())
    except asyncio.CancelledError:
        with contextlib.suppress(Exception):  # a state's wording never fails the stop
            await cancel_left_behind(
                flow_run.id, "the run was stopped before this partition finished", stop.at
            )
        raise
    with contextlib.suppress(Exception):  # a report never fails the run
        await publish_limit_changes(srv.controller)
    # A fault no retry can fix stopped every partition: that is the run's one reason.
    outcome.stopped_by(srv.supervisor.error() if srv.supervisor.failed else None)
    return dict(zip(to_run, final, strict=True))


async def _record_end(name: str, state: State[Any], outcome: RunOutcome) -> None:
    """A partition's subflow ended: completed (its summary), or failed or cancelled (why)."""
    if state.is_completed():
        outcome.partition_completed(name, await state.aresult())
    elif state.is_cancelled():
        outcome.partition_cancelled(name, state.message)
    else:
        reason = failure_reason(state.message, state.type.value)
        outcome.partition_failed(name, state.type.value, reason, state.message)


def _write_manifest(
    config: PipelineConfig, fingerprint: dict[str, Any], outcome: RunOutcome, logger: LogSink
) -> WrittenDataset:
    """The manifest with this run's partitions, and the dataset card from it; an empty
    manifest when it could not be written and that is only a consequence of the run's own
    reason (the outcome decides)."""
    try:
        written = write_manifest_and_card(
            config.output_dir, fingerprint, outcome.results, config.serving_profile
        )
    except (OSError, OutputWriteError) as err:
        if not outcome.manifest_failure_is_consequence():
            raise
        logger.warning(f"manifest not updated: {err}")
        return WrittenDataset({})
    if written.card_error is not None:
        logger.warning(f"dataset card not written: {written.card_error}")
    return written


def _locks(config: PipelineConfig, names: list[str], flow_run: FlowRun) -> PartitionLocks:
    """One writer per partition, held under this run's id and name (another run's message
    names who holds it)."""
    return PartitionLocks(
        config.output_dir,
        names,
        run_id=str(flow_run.id),
        run_name=flow_run.name,
        wait_s=config.lock_wait_s,
    )


def _run_name(prefix: str = "") -> str:
    """What ran: the deployment (or output directory), the partitions, when it was due (UTC).
    A name a person gave the run, or its earlier attempt's (a retry), is kept."""
    if keeps_name(current_run.name):
        return str(current_run.name)
    params = current_run.parameters
    when = current_run.scheduled_start_time or datetime.now(UTC)
    name = run_name(current_deployment.name, params.get("config"), params.get("partitions"), when)
    return prefix + name


def fanout_run_name() -> str:
    """The fan-out parent's name: ``fan-out kimi-k2.5: B1_glaive+B2_code 2026-11-29 02:00Z``."""
    return _run_name("fan-out ")


@flow(
    name="eagle3-datagen",
    flow_run_name=_run_name,
    on_cancellation=[_stop_server_hook, keep_own_message],
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
    expected_failures.install()  # an expected failure: one ERROR line, no traceback
    logger = get_run_logger()
    names = [p.name for p in config.select(partitions)]  # unknown names fail here
    flow_run = await this_run(names, logger)
    meter = RunMeter()
    outcome = RunOutcome(names)
    report = RunReport(flow_run, outcome, meter)
    locks = _locks(config, names, flow_run)
    stopped: State[Any] | None = None
    try:
        # Inputs, tokenizer, special tokens, output before the server: a model load takes
        # minutes. Then one writer per partition: another run holding one refuses this one.
        check = check_before_server(config, names, sizes=meter.sizes, overwrite=overwrite)
        for note in await asyncio.to_thread(locks.acquire):
            logger.warning(note)
        await report.open()
        async with (
            flow_body() as stop,
            _session(
                config, names, check, meter, flow_run, server_url, overwrite, logger
            ) as session,
            report.watching(config.throughput),
        ):
            emit_limit_changes(session.srv.controller, flow_run)
            states = await _run_partitions(
                config, names, session, outcome, flow_run, stop, report.refresh_progress
            )
        written = _write_manifest(config, session.fingerprint, outcome, logger)
        await report.publish_data(config.output_dir, written, states)
    except BaseException as err:
        stopped = stopped_run(err, outcome)  # Cancelled (not Crashed) when someone stopped it
    finally:
        await report.summary(config.output_dir)
        locks.release()
        await report.record_history(config.output_dir)
    if stopped is not None:
        return stopped  # type: ignore[return-value]
    failure = outcome.failure()
    if failure is not None:
        raise failure
    return written.manifest
