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
from typing import Any
from uuid import UUID

from prefect.artifacts import acreate_table_artifact
from prefect.client.orchestration import get_client
from prefect.client.schemas.actions import ArtifactUpdate
from prefect.client.schemas.filters import (
    ArtifactFilter,
    ArtifactFilterKey,
    FlowRunFilter,
    FlowRunFilterId,
    FlowRunFilterParentFlowRunId,
)
from prefect.client.schemas.objects import Artifact
from prefect.settings import PREFECT_UI_URL
from prefect.states import State

from eagle3_datagen.errors import PartitionFailed
from eagle3_datagen.report.supersede import FailedTable, supersede
from eagle3_datagen.report.ui import (
    FAILED_BATCHES_PREFIX,
    run_failed_batch_row,
    run_failed_batches_description,
)
from eagle3_datagen_flows.prefect_text import artifact_key, artifact_link

# The parent's table: every failed batch of the run, one row each, with its partition.
RUN_FAILED_BATCHES_KEY = FAILED_BATCHES_PREFIX


def _has_rows(artifact: Artifact) -> bool:
    data = artifact.data
    try:
        rows = json.loads(data) if isinstance(data, str) else data
    except ValueError:
        return False
    return isinstance(rows, list) and any(isinstance(r, dict) for r in rows)


async def failed_batch_tables(
    states: dict[str, State[Any]],
) -> tuple[dict[str, tuple[int, str]], list[dict[str, Any]]]:
    """Per failed partition: (failed batches, link to its table); and every failed batch with
    its partition (linked to its table) first, for the parent's own table. The rows are what
    each failed subflow returned with its error (``PartitionFailed``), not read back."""
    links: dict[str, tuple[int, str]] = {}
    rows: list[dict[str, Any]] = []
    ui_url = PREFECT_UI_URL.value()
    for name, state in states.items():
        if state.is_completed():
            continue
        try:
            err = await state.aresult(raise_on_failure=False)
        except Exception:  # a state without its error (a crash): no rows to list
            continue
        if not isinstance(err, PartitionFailed) or not err.rows:
            continue
        link = artifact_link(ui_url, str(err.table_id)) if err.table_id else ""
        links[name] = (len(err.rows), link)
        shown = f"[{name}]({link})" if link else name
        rows += [run_failed_batch_row(shown, row) for row in err.rows]
    return links, rows


async def _runs(client: Any, run_ids: set[UUID]) -> dict[UUID, Any]:
    runs = await client.read_flow_runs(
        flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=list(run_ids)))
    )
    return {run.id: run for run in runs}


def _output_dir(run: Any) -> str | None:
    config = (run.parameters or {}).get("config") if run is not None else None
    where = config.get("output_dir") if isinstance(config, dict) else None
    return where if isinstance(where, str) else None


async def _failed_partitions(client: Any, run_ids: set[UUID]) -> dict[UUID, frozenset[str]]:
    """Per parent run, the partitions whose subflows failed: those its table listed (a
    failed-batches table is written by a partition that failed)."""
    failed: dict[UUID, frozenset[str]] = {}
    for run_id in run_ids:
        subs = await client.read_flow_runs(
            flow_run_filter=FlowRunFilter(
                parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=[run_id])
            )
        )
        failed[run_id] = frozenset(
            str((sub.parameters or {}).get("partition"))
            for sub in subs
            if sub.state is not None and sub.state.is_failed()
        )
    return failed


async def _supersede(key: str, output_dir: str, covered: set[str], by: str) -> None:
    """Mark the failed versions of ``key`` that this run's success supersedes
    (``report/supersede.py`` decides which)."""
    async with get_client() as client:
        versions = await client.read_artifacts(
            artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[key]))
        )
        failed = [a for a in versions if _has_rows(a) and a.flow_run_id is not None]
        if not failed:
            return
        run_ids = {a.flow_run_id for a in failed if a.flow_run_id}
        runs = await _runs(client, run_ids)
        lists = await _failed_partitions(client, run_ids) if key == RUN_FAILED_BATCHES_KEY else {}
        tables = [
            FailedTable(
                id=a.id,
                output_dir=_output_dir(runs.get(a.flow_run_id)),  # type: ignore[arg-type]
                description=a.description or "",
                partitions=lists.get(a.flow_run_id, frozenset()),  # type: ignore[arg-type]
            )
            for a in failed
        ]
        latest = max(versions, key=lambda a: str(a.created or "")).id
        decided = supersede(tables, latest, output_dir, covered, by)
        for artifact_id, description in decided.descriptions.items():
            await client.update_artifact(artifact_id, ArtifactUpdate(description=description))
    if decided.new_version is not None:
        await acreate_table_artifact([], key=key, description=decided.new_version)


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
        await _supersede(RUN_FAILED_BATCHES_KEY, output_dir, completed, by)


async def supersede_partition(partition: str, output_dir: str, by: str) -> None:
    """A partition whose batches all committed: its earlier failed-batches tables say so."""
    await _supersede(artifact_key(FAILED_BATCHES_PREFIX, partition), output_dir, {partition}, by)
