"""``concurrency: auto`` in a whole run behind a router-like front (two emulators, a round-robin
front whose /metrics is sglang-router's and whose /v1/loads is 404), next to a static tier: the
run says once where it reads the load from, the static partition keeps its concurrency, and
every change of the limit is a Prefect event and a row of the ``auto-concurrency`` table."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from eagle3_datagen.config import PipelineConfig
from eagle3_datagen_cli.flow_run import run_pipeline
from eagle3_datagen_flows.auto_concurrency import AUTO_CONCURRENCY_KEY, LIMIT_EVENT
from tests.support.front import FrontProcess
from tests.support.pipeline import base_config, records
from tests.support.prompts import prompt_ids, write_prompts

pytestmark = pytest.mark.usefixtures("prefect_backend")


async def _run_artifacts_and_logs(
    output_dir: Path,
) -> tuple[list[Any], list[str], list[Any], int]:
    """The run's auto-concurrency artifacts, its log lines, its first 50 limit events and how
    many there are (the events API returns 50 at most)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (
        ArtifactFilter,
        ArtifactFilterFlowRunId,
        ArtifactFilterKey,
        LogFilter,
        LogFilterFlowRunId,
    )
    from prefect.client.schemas.sorting import FlowRunSort
    from prefect.events.filters import EventFilter, EventNameFilter, EventResourceFilter
    from prefect.logging.handlers import APILogHandler

    await APILogHandler.aflush()
    async with get_client() as client:
        recent = await client.read_flow_runs(sort=FlowRunSort.START_TIME_DESC, limit=50)
        (parent,) = [
            r
            for r in recent
            if (r.parameters.get("config") or {}).get("output_dir") == str(output_dir)
            and r.parent_task_run_id is None
        ]
        artifacts = await client.read_artifacts(
            artifact_filter=ArtifactFilter(
                flow_run_id=ArtifactFilterFlowRunId(any_=[parent.id]),
                key=ArtifactFilterKey(any_=[AUTO_CONCURRENCY_KEY]),
            )
        )
        logs = await client.read_logs(
            log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[parent.id])), limit=200
        )
        events: list[Any] = []
        total = 0
        for _ in range(50):  # events reach the API in the background
            page = await client.read_events(
                filter=EventFilter(
                    event=EventNameFilter(name=[LIMIT_EVENT]),
                    resource=EventResourceFilter(id=[f"prefect.flow-run.{parent.id}"]),
                ),
                limit=50,
            )
            events, total = list(page.events), page.total
            if events:
                break
            await asyncio.sleep(0.2)
    return artifacts, [log.message for log in logs], events, total


def test_auto_behind_a_router_next_to_a_static_tier(tmp_path: Path, emulator_factory: Any) -> None:
    emus = [
        emulator_factory(
            "--emu-physics",
            "seed-node",
            "--emu-time-scale",
            "0.002",
            "--enable-metrics",
            "--emu-mean-output-tokens",
            "200",
        )
        for _ in range(2)
    ]
    for emu in emus:
        emu.wait_ready()
    data = base_config(tmp_path, write_prompts(tmp_path / "auto.jsonl", 300, words=20))
    write_prompts(tmp_path / "static.jsonl", 120, words=20, first=5000)
    data["tiers"] = [
        {"name": "AUTO", "concurrency": "auto", "max_tokens": 2048},
        {"name": "FIXED", "concurrency": 4, "max_tokens": 2048},
    ]
    data["partitions"] = [
        {"name": "auto", "input": str(tmp_path / "auto.jsonl"), "tier": "AUTO"},
        {"name": "static", "input": str(tmp_path / "static.jsonl"), "tier": "FIXED"},
    ]
    with FrontProcess([e.url for e in emus], tmp_path / "front.log") as front:
        data["server"] = {
            "mode": "attach",
            "url": front.url,
            "max_requests_in_flight": 48,
            "auto_concurrency": {"initial": 4, "interval_s": 0.2},
        }
        config = PipelineConfig.model_validate(data)
        ok, result = run_pipeline(config)
    assert ok, result
    out = Path(config.output_dir)
    assert sorted(records(out, "auto")) == prompt_ids(300)
    assert sorted(records(out, "static")) == prompt_ids(120, first=5000)

    artifacts, logs, events, total = asyncio.run(_run_artifacts_and_logs(out))
    warned = [m for m in logs if m.startswith("concurrency auto: ") and "sgl_router_" in m]
    assert len(warned) == 1, logs
    assert "steering on the responses alone" in warned[0]
    (table,) = artifacts
    rows = table.data if isinstance(table.data, list) else json.loads(table.data)
    assert rows and rows[0]["previous"] == 4 and rows[0]["source"] == "responses"
    assert all(row["limit"] <= 48 for row in rows)  # the user's ceiling
    assert total == len(rows)  # an event per change
    assert {e.payload["limit"] for e in events} <= {row["limit"] for row in rows}
