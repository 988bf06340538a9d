"""A run as an operator names and retries it: a typed name is kept, subflows are dated, the
parent is tagged with its partitions, and a run retried (as the UI's Retry does: state
AwaitingRetry, then a worker runs the same flow run again) reads as its final attempt in
``failures``, in its summary artifacts and in ``history``, with the earlier attempt reachable.

Real parts: Prefect's local backend, the flow run created through the API and executed by
Prefect's own engine (``run_flow``, what a worker's process calls), real emulator processes on
one port (answering HTTP 500 for the first attempt, healthy for the retry).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import (
    ArtifactFilter,
    ArtifactFilterFlowRunId,
    ArtifactFilterKey,
    FlowRunFilter,
    FlowRunFilterParentFlowRunId,
)
from prefect.client.schemas.objects import FlowRun
from prefect.flow_engine import run_flow
from prefect.states import AwaitingRetry

from eagle3_datagen.demo import demo_config
from eagle3_datagen.report.history import history_rows, read_history
from eagle3_datagen.report.ui import EMULATED
from eagle3_datagen_cli.failures import failed_batches, failures_text
from eagle3_datagen_flows.pipeline import datagen
from tests.support import free_port
from tests.support.emulator import EmulatorProcess

pytestmark = [pytest.mark.usefixtures("prefect_backend"), pytest.mark.slow]

TYPED = "nightly by hand"
DATED = re.compile(r"partition-demo_(short|long|images) \d{4}-\d\d-\d\d \d\d:\d\dZ")


async def _attempt(run_id: Any) -> FlowRun:
    """The flow run executed once more by Prefect's engine; the run as the API then has it."""
    async with get_client() as client:
        flow_run = await client.read_flow_run(run_id)
    await run_flow(datagen, flow_run=flow_run, return_type="state")  # type: ignore[misc]
    async with get_client() as client:
        return await client.read_flow_run(run_id)


async def test_a_retried_run_reads_as_its_final_attempt(tmp_path: Path) -> None:
    port = free_port()
    broken = EmulatorProcess("--emu-fault-500-rate", "1.0", port=port, log_dir=tmp_path)
    config = demo_config(tmp_path / "out").model_dump(mode="json")
    config["retries"].update(
        max_attempts=2, backoff_initial_s=0.1, batch_retries=1, batch_retry_delay_s=[0.2]
    )
    params = {"config": config, "server_url": f"http://127.0.0.1:{port}"}
    async with get_client() as client:
        created = await client.create_flow_run(datagen, name=TYPED, parameters=params)
    try:
        broken.wait_ready()
        first = await _attempt(created.id)
    finally:
        broken.stop()
    assert first.state is not None and first.state.is_failed(), first.state
    # The name a person typed is kept; the parent carries its partitions' tags.
    assert first.name == TYPED
    assert {"partition:demo_short", "partition:demo_long"} <= set(first.tags)

    (tmp_path / "healthy").mkdir()
    healthy = EmulatorProcess(port=port, log_dir=tmp_path / "healthy")
    try:
        healthy.wait_ready()
        async with get_client() as client:  # the UI's Retry
            await client.set_flow_run_state(created.id, AwaitingRetry(), force=True)
        final = await _attempt(created.id)
    finally:
        healthy.stop()
    assert final.state is not None and final.state.is_completed(), final.state
    assert final.name == TYPED and final.run_count == 2  # not renamed to the retry's time

    async with get_client() as client:
        subs = await client.read_flow_runs(
            flow_run_filter=FlowRunFilter(
                parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=[created.id])
            )
        )
        summaries = await client.read_artifacts(
            artifact_filter=ArtifactFilter(
                flow_run_id=ArtifactFilterFlowRunId(any_=[created.id]),
                key=ArtifactFilterKey(any_=["datagen-summary"]),
            )
        )
    # Both attempts' subflows exist (earlier ones reachable), each named and dated.
    assert len(subs) == 6 and all(DATED.fullmatch(s.name) for s in subs), [s.name for s in subs]

    # `failures`: the run COMPLETED with no failed batch, the earlier attempt named, not listed.
    found = await failed_batches(str(created.id))
    text = failures_text(found)
    assert found.rows == [] and found.superseded == 3, text
    assert text.splitlines()[0] == f"flow run {TYPED!r} ({created.id}) COMPLETED; attempt 2"
    assert text.splitlines()[1] == (
        f"(3 partition runs of earlier attempts left out: eagle3-datagen failures {created.id} "
        "--all-attempts)"
    )
    assert text.splitlines()[-1] == "no failed batches"
    everything = await failed_batches(str(created.id), all_attempts=True)
    # demo_short 4 batches, demo_long 2, demo_images 1
    assert len(everything.rows) == 7, everything.rows

    # The summaries: the final attempt's leads, the first says it was superseded.
    summaries.sort(key=lambda a: a.created)  # type: ignore[arg-type, return-value]
    assert len(summaries) == 2
    assert (summaries[0].description or "").startswith("Superseded by attempt 2 of this run")
    assert not (summaries[1].description or "").startswith("Superseded")
    # Made by the emulator: the UI says so first (the dataset card is not in the UI).
    assert (summaries[1].description or "").startswith(f"{EMULATED}; 3 partitions, ")
    data = summaries[1].data
    rows_now: Any = json.loads(data) if isinstance(data, str) else data
    assert {row["status"] for row in rows_now} == {"completed"}, rows_now

    # History: one line per attempt on disk; the table shows the final one.
    entries = read_history(tmp_path / "out")
    assert [e["attempt"] for e in entries] == [1, 2]
    rows = history_rows(entries)
    assert {(r["run"], r["status"]) for r in rows} == {(f"{TYPED} (attempt 2)", "completed")}
    assert len(history_rows(entries, all_attempts=True)) == 6  # 3 partitions x 2 attempts
