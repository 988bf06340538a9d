"""The failed-batches tables an operator opens: each partition subflow's, the parent's (every
failed batch of the run's latest attempt, in one table), and the word that a later success
superseded them.

Prefect's Artifacts page shows each key's latest version, whichever run made it. So a run in
which a partition's batches all committed makes a new, empty version of that partition's key
(and of the parent's, when every partition it listed completed) whose description says which
run superseded it, and marks the failed versions' own descriptions the same way. Only failures
written into the same output directory are superseded: another run's elsewhere stay.
"""

from __future__ import annotations

import json
import os
from typing import Any
from uuid import UUID

from prefect.artifacts import acreate_table_artifact
from prefect.client.orchestration import get_client
from prefect.client.schemas.actions import ArtifactUpdate
from prefect.client.schemas.filters import (
    ArtifactFilter,
    ArtifactFilterFlowRunId,
    ArtifactFilterKey,
    FlowRunFilter,
    FlowRunFilterId,
)
from prefect.client.schemas.objects import Artifact
from prefect.settings import PREFECT_UI_URL
from prefect.states import State

from eagle3_datagen.report.ui import (
    FAILED_BATCHES_PREFIX,
    SUPERSEDED,
    run_failed_batch_row,
    run_failed_batches_description,
    superseded_description,
)
from eagle3_datagen_flows.prefect_text import artifact_key, artifact_link

# The parent's table: every failed batch of the run, one row each, with its partition.
RUN_FAILED_BATCHES_KEY = FAILED_BATCHES_PREFIX


def _rows(artifact: Artifact) -> list[dict[str, Any]]:
    data = artifact.data
    try:
        rows = json.loads(data) if isinstance(data, str) else data
    except ValueError:
        return []
    return [r for r in rows if isinstance(r, dict)] if isinstance(rows, list) else []


async def failed_batch_tables(
    states: dict[str, State[Any]],
) -> tuple[dict[str, tuple[int, str]], list[dict[str, Any]]]:
    """Per failed partition: (failed batches, link to its table); and every row of those
    tables with its partition and link first, for the parent's own table."""
    links: dict[str, tuple[int, str]] = {}
    rows: list[dict[str, Any]] = []
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
                table = _rows(found[0])
                link = artifact_link(ui_url, str(found[0].id))
                links[name] = (len(table), link)
                rows += [run_failed_batch_row(f"[{name}]({link})", row) for row in table]
    return links, rows


async def _output_dirs(client: Any, run_ids: set[UUID]) -> dict[UUID, str | None]:
    runs = await client.read_flow_runs(
        flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=list(run_ids)))
    )
    dirs: dict[UUID, str | None] = {}
    for run in runs:
        config = (run.parameters or {}).get("config")
        where = config.get("output_dir") if isinstance(config, dict) else None
        dirs[run.id] = _same_path(where) if where else None
    return dirs


def _same_path(path: str) -> str:
    return os.path.abspath(os.path.expanduser(path))


async def supersede(key: str, output_dir: str, covered: set[str], by: str) -> None:
    """Mark the failed versions of ``key`` made for ``output_dir`` whose partitions are all in
    ``covered`` (a row without a partition is the key's own) as superseded by ``by``; when the
    key's latest version is one of them, add a new empty version that says so."""
    async with get_client() as client:
        versions = await client.read_artifacts(
            artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[key]))
        )
        failed = [a for a in versions if _rows(a) and a.flow_run_id is not None]
        if not failed:
            return
        dirs = await _output_dirs(client, {a.flow_run_id for a in failed if a.flow_run_id})
        marked: set[UUID] = set()
        for artifact in failed:
            parts = {str(r.get("partition", "")).split("]")[0].lstrip("[") for r in _rows(artifact)}
            mine = dirs.get(artifact.flow_run_id) == _same_path(output_dir)  # type: ignore[arg-type]
            if not mine or not parts <= covered | {""}:
                continue
            marked.add(artifact.id)
            text = artifact.description or ""
            if not text.startswith(SUPERSEDED):
                note = superseded_description(by, text)
                await client.update_artifact(artifact.id, ArtifactUpdate(description=note))
    latest = max(versions, key=lambda a: str(a.created or ""))
    if latest.id in marked:
        await acreate_table_artifact([], key=key, description=superseded_description(by, ""))


async def publish_run_failures(
    rows: list[dict[str, Any]], output_dir: str, completed: set[str], by: str
) -> None:
    """The parent's failed-batches table for this attempt; with none failed, the earlier
    tables of the partitions this attempt completed say they are superseded."""
    if rows:
        await acreate_table_artifact(
            rows, key=RUN_FAILED_BATCHES_KEY, description=run_failed_batches_description(rows)
        )
    else:
        await supersede(RUN_FAILED_BATCHES_KEY, output_dir, completed, by)


async def supersede_partition(partition: str, output_dir: str, by: str) -> None:
    """A partition whose batches all committed: its earlier failed-batches tables say so."""
    await supersede(artifact_key(FAILED_BATCHES_PREFIX, partition), output_dir, {partition}, by)
