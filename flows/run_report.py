"""What the parent flow shows in Prefect while and after it runs: the live progress table, the
throughput alarm (log line, event, artifact), the failed-batches links, the data pictures, the
coverage against the serving profile, the summary table and the run's line of the output
directory's history. The wording and the outcome policy are the library's (``report/``); this
module only hands them to Prefect's artifact and event APIs, and no failure here fails a run.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any
from uuid import UUID

from prefect import get_run_logger
from prefect.artifacts import (
    acreate_markdown_artifact,
    acreate_progress_artifact,
    acreate_table_artifact,
    aupdate_progress_artifact,
)
from prefect.client.orchestration import get_client
from prefect.client.schemas.actions import ArtifactUpdate
from prefect.client.schemas.filters import (
    ArtifactFilter,
    ArtifactFilterFlowRunId,
)
from prefect.client.schemas.objects import FlowRun
from prefect.events import emit_event
from prefect.runtime import deployment as current_deployment
from prefect.states import State

from eagle3_datagen.config import ThroughputAlarm
from eagle3_datagen.report.coverage import COVERAGE_KEY, coverage_line, coverage_markdown
from eagle3_datagen.report.data_picture import picture_description, picture_markdown
from eagle3_datagen.report.dataset_card import WrittenDataset, from_emulator
from eagle3_datagen.report.history import (
    append_history,
    history_entry,
    history_rows,
    read_history,
    ui_history_rows,
)
from eagle3_datagen.report.outcome import RunOutcome
from eagle3_datagen.report.probe import Baseline
from eagle3_datagen.report.throughput import (
    RunMeter,
    ThroughputChange,
    ThroughputMonitor,
    sample_interval,
)
from eagle3_datagen.report.ui import (
    DATA_PREFIX,
    RUN_PROGRESS_KEY,
    SUMMARY_KEY,
    SUPERSEDED,
    THROUGHPUT_KEY,
    progress_percent,
    run_progress_markdown,
    summary_description,
    throughput_log_line,
    throughput_markdown,
)
from eagle3_datagen.write.manifest import read_manifest
from eagle3_datagen_flows.failed_batches import failed_batch_tables, publish_run_failures
from eagle3_datagen_flows.partition import PROGRESS_EVERY_S
from eagle3_datagen_flows.prefect_text import artifact_key, throughput_event


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
    """Sample the run's output tokens until cancelled; tell what the monitor says happened: a
    measured baseline (logged, appended to ``probed`` for the summary), an ok/low transition
    (announced)."""
    monitor = ThroughputMonitor.from_config(alarm, time.monotonic())
    if monitor is None:
        return
    logger = get_run_logger()
    while True:
        await asyncio.sleep(sample_interval(alarm.window_s))
        happened = monitor.observe(time.monotonic(), meter.total_tokens())
        if isinstance(happened, Baseline):
            logger.info(happened.summary())
            probed.append(happened)
        elif happened is not None:
            try:
                await _announce(happened, flow_run, logger)
            except Exception as err:  # an alarm must never break the run it watches
                logger.warning(f"throughput alarm could not be published: {err}")


WATCHERS_STOP_S = 10.0  # how long the run's end waits for its cancelled watchers
HISTORY_KEY = "datagen-history"
HISTORY_ROWS = 60  # the table artifact's latest rows (the file keeps every run)


async def _mark_earlier_attempts(flow_run: FlowRun) -> None:
    """A run retried from the UI keeps its earlier attempts' artifacts (reachable, and the
    Artifacts page shows each key's latest version, this attempt's); their descriptions now
    start by saying which attempt replaced them, so none reads as the run's outcome."""
    attempt = flow_run.run_count or 1
    if attempt <= 1:
        return
    async with get_client() as client:
        earlier = await client.read_artifacts(
            artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run.id]))
        )
        for artifact in earlier:
            text = artifact.description or ""
            if not text.startswith(SUPERSEDED):
                note = f"{SUPERSEDED} by attempt {attempt} of this run (a retry): {text}"
                await client.update_artifact(artifact.id, ArtifactUpdate(description=note))


class RunReport:
    """The parent's artifacts for one run; reads the run's outcome and meter, never decides."""

    def __init__(self, flow_run: FlowRun, outcome: RunOutcome, meter: RunMeter) -> None:
        self.flow_run = flow_run
        self.outcome = outcome
        self.meter = meter
        self.started = datetime.now(UTC)  # the run's start, for its history line
        self.progress_id: UUID | None = None
        self.probed: list[Baseline] = []  # the throughput probe's baseline, once measured
        self.failed_links: dict[str, tuple[int, str]] = {}
        self._changed = asyncio.Event()  # a partition ended: the table is updated at once

    async def open(self) -> None:
        """The live progress table, one row per partition (all waiting); on a retried run,
        the earlier attempts' artifacts first say that they are superseded."""
        try:
            await _mark_earlier_attempts(self.flow_run)
        except Exception as err:
            get_run_logger().warning(f"earlier attempts' artifacts not marked: {err}")
        self.progress_id = await acreate_progress_artifact(
            0.0,
            key=RUN_PROGRESS_KEY,
            description=run_progress_markdown(self.meter, self.outcome.states),
        )

    async def _update_progress(self, states: dict[str, str]) -> None:
        if self.progress_id is None:
            return
        done, total = self.meter.totals()
        await aupdate_progress_artifact(
            self.progress_id,
            progress_percent(done, total),
            description=run_progress_markdown(self.meter, states),
        )

    def refresh_progress(self) -> None:
        """A partition ended: the live table shows it now, not at its next period."""
        self._changed.set()

    async def _watch_progress(self) -> None:
        """Update the progress table every PROGRESS_EVERY_S and when a partition ends, until
        cancelled; a failed update (the Prefect API away longer than its client retries) is
        skipped."""
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), PROGRESS_EVERY_S)
            self._changed.clear()
            try:
                await self._update_progress(self.outcome.states)
            except Exception as err:
                get_run_logger().warning(f"run progress artifact not updated: {err}")

    @contextlib.asynccontextmanager
    async def watching(self, alarm: ThroughputAlarm) -> AsyncIterator[None]:
        """The throughput alarm and the progress table, live while the block runs."""
        watchers = [
            asyncio.create_task(_watch_throughput(alarm, self.meter, self.flow_run, self.probed)),
            asyncio.create_task(self._watch_progress()),
        ]
        try:
            yield
        finally:
            for watcher in watchers:
                watcher.cancel()
            # A watcher cancelled inside a Prefect API call can wait on that call for good (seen:
            # the progress update's call pending after the run's temporary API server was gone,
            # and the command never exited); a report never holds up the run's end.
            await asyncio.wait(watchers, timeout=WATCHERS_STOP_S)
            for watcher in watchers:  # a watcher's own failure was a report's, not the run's
                if watcher.done() and not watcher.cancelled():
                    watcher.exception()

    async def publish_data(
        self, output_dir: str, written: WrittenDataset, states: dict[str, State[Any]]
    ) -> None:
        """The failed-batches tables (or the word that earlier ones are superseded), the
        coverage and a data picture per partition of this run, from what the library wrote
        with the manifest; reports must never fail a run that generated its data."""
        try:
            self.failed_links, rows = await failed_batch_tables(states)
            by = f"run {self.flow_run.name!r} (attempt {self.flow_run.run_count or 1})"
            await publish_run_failures(rows, output_dir, self.outcome.completed, by)
            if written.coverage is not None:
                text, line = coverage_markdown(written.coverage), coverage_line(written.coverage)
                await acreate_markdown_artifact(text, key=COVERAGE_KEY, description=line)
            for name in self.outcome.names:
                picture = written.pictures.get(name)
                if picture is not None:
                    await acreate_markdown_artifact(
                        picture_markdown(picture),
                        key=artifact_key(DATA_PREFIX, name),
                        description=picture_description(picture),
                    )
        except Exception as err:
            get_run_logger().warning(
                f"failed-batches, coverage or data artifacts not written: {err}"
            )

    async def summary(self, output_dir: str) -> None:
        """The summary table and the progress table's last word, whatever the outcome."""
        try:
            rows = self.outcome.summary_rows(output_dir, self.meter, self.failed_links)
            fingerprint = (read_manifest(output_dir) or {}).get("fingerprint") or {}
            description = summary_description(rows, output_dir, emulated=from_emulator(fingerprint))
            await acreate_table_artifact(
                rows, key=SUMMARY_KEY, description="; ".join([description, *map(str, self.probed)])
            )
            await self._update_progress(self.outcome.final_states())
        except Exception as err:
            get_run_logger().warning(f"run summary artifact not written: {err}")

    async def record_history(self, output_dir: str) -> None:
        """The run's line of ``history.jsonl`` and the directory's history table artifact; only
        for a run that generated (one stopped before its partitions started made no numbers)."""
        if not any(self.meter.progress(name) for name in self.outcome.names):
            return
        try:
            entry = history_entry(
                output_dir,
                self.meter,
                self.outcome.final_states(),
                run_id=str(self.flow_run.id),
                run_name=self.flow_run.name,
                started=self.started,
                ended=datetime.now(UTC),
                deployment=current_deployment.name,
                attempt=self.flow_run.run_count or 1,
            )
            append_history(output_dir, entry)
            table = ui_history_rows(history_rows(read_history(output_dir))[-HISTORY_ROWS:])
            await acreate_table_artifact(
                table, key=HISTORY_KEY, description=f"runs into {output_dir}, latest last"
            )
        except Exception as err:  # reports must never fail a run that generated its data
            get_run_logger().warning(f"run history not written: {err}")
