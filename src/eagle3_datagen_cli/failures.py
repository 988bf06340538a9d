"""A run's failed batches, read from the Prefect API (``eagle3-datagen failures [FLOW_RUN]``).

It reads the failed-batches tables the partition subflows write (and, for a partition still
running or one that crashed before writing its table, the failed batch task runs' own
messages).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any
from uuid import UUID

from prefect.client.orchestration import PrefectClient, get_client
from prefect.client.schemas.filters import (
    ArtifactFilter,
    ArtifactFilterFlowRunId,
    ArtifactFilterKey,
    FlowFilter,
    FlowFilterName,
    FlowRunFilter,
    FlowRunFilterId,
    FlowRunFilterName,
    FlowRunFilterParentFlowRunId,
    FlowRunFilterParentTaskRunId,
    TaskRunFilter,
    TaskRunFilterName,
    TaskRunFilterState,
    TaskRunFilterStateType,
)
from prefect.client.schemas.objects import FlowRun, StateType
from prefect.client.schemas.sorting import FlowRunSort

from eagle3_datagen.errors import ConfigError
from eagle3_datagen.report.ui import FAILED_BATCHES_PREFIX
from eagle3_datagen_flows.prefect_text import failure_reason

PARENT_FLOWS = ["eagle3-datagen", "eagle3-datagen-fanout"]


async def _find_run(client: PrefectClient, ref: str | None, where: str) -> FlowRun:
    """A flow run by id or name; without one, the latest top-level run of the pipeline."""
    if ref:
        try:
            return await client.read_flow_run(UUID(ref))
        except ValueError:
            pass
        runs = await client.read_flow_runs(
            flow_run_filter=FlowRunFilter(name=FlowRunFilterName(any_=[ref])), limit=2
        )
        if not runs:
            raise ConfigError(f"no flow run with id or name {ref!r} in {where}")
        return runs[0]
    runs = await client.read_flow_runs(
        flow_filter=FlowFilter(name=FlowFilterName(any_=PARENT_FLOWS)),
        flow_run_filter=FlowRunFilter(
            parent_task_run_id=FlowRunFilterParentTaskRunId(is_null_=True)
        ),
        sort=FlowRunSort.EXPECTED_START_TIME_DESC,
        limit=1,
    )
    if not runs:
        raise ConfigError(f"no eagle3-datagen flow run in {where}: nothing to read")
    return runs[0]


def _partitions_of(run: FlowRun) -> tuple[str, ...]:
    """What a child run did: its partition (a subflow) or partitions (a fan-out job)."""
    params = run.parameters or {}
    if params.get("partition"):
        return (str(params["partition"]),)
    return tuple(params.get("partitions") or ())


def latest_attempts(children: list[FlowRun]) -> tuple[list[FlowRun], list[FlowRun]]:
    """A retried parent starts a new child run for every partition that did not complete:
    (the latest run of each partition, the earlier ones it superseded)."""
    latest: dict[tuple[str, ...], FlowRun] = {}
    earlier: list[FlowRun] = []
    for child in sorted(children, key=lambda r: (r.expected_start_time or r.created, r.created)):
        key = _partitions_of(child) or (str(child.id),)
        if key in latest:
            earlier.append(latest[key])
        latest[key] = child
    return list(latest.values()), earlier


async def _descendants(
    client: PrefectClient, run: FlowRun, all_attempts: bool
) -> tuple[list[FlowRun], int]:
    """The run and every flow run under it (partition subflows; fan-out jobs and theirs), of
    the final attempt only unless ``all_attempts``; and how many runs earlier attempts made."""
    found, frontier, superseded = [run], [run.id], 0
    while frontier:
        children = await client.read_flow_runs(
            flow_run_filter=FlowRunFilter(
                parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=frontier)
            )
        )
        if not all_attempts:
            children, earlier = latest_attempts(children)
            superseded += len(earlier)
        found += children
        frontier = [c.id for c in children]
    return found, superseded


@dataclass
class Failures:
    """A run's failed batches, of its final attempt (or of all, when asked)."""

    run: FlowRun
    rows: list[dict[str, Any]]
    superseded: int = 0  # partition runs of earlier attempts left out
    all_attempts: bool = False


async def failed_batches(
    ref: str | None, where: str = "this Prefect server", *, all_attempts: bool = False
) -> Failures:
    """The run and its failed batches: rows of the failed-batches tables, then any failed
    batch task whose partition wrote no table (``cause`` from the task run's state message).
    A retried run reads as its final attempt: the partition runs its earlier attempts made
    are left out unless ``all_attempts``. ``where`` names the API in a 'no such run' error."""
    async with get_client() as client:
        run = await _find_run(client, ref, where)
        runs, superseded = await _descendants(client, run, all_attempts)
        ids = [r.id for r in runs]
        artifacts = await client.read_artifacts(
            artifact_filter=ArtifactFilter(
                flow_run_id=ArtifactFilterFlowRunId(any_=ids),
                key=ArtifactFilterKey(like_=f"{FAILED_BATCHES_PREFIX}-"),
            )
        )
        rows: list[dict[str, Any]] = []
        for artifact in artifacts:
            data = artifact.data
            table = json.loads(data) if isinstance(data, str) else data
            rows += table if isinstance(table, list) else []
        tasks = await client.read_task_runs(
            flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=ids)),
            task_run_filter=TaskRunFilter(
                name=TaskRunFilterName(like_="generate["),
                state=TaskRunFilterState(type=TaskRunFilterStateType(any_=[StateType.FAILED])),
            ),
        )
    seen = {row["batch"] for row in rows}
    for task in sorted(tasks, key=lambda t: t.name):
        label = task.name.removeprefix("generate[").removesuffix("]")
        if label in seen:
            continue
        message = (task.state.message if task.state else None) or "no message"
        rows.append(
            {
                "batch": label,
                "first_line": None,
                "last_line": None,
                "cause": message.removeprefix(f"{task.name}: "),
                "attempts": task.run_count,
            }
        )
    return Failures(run, sorted(rows, key=lambda r: r["batch"]), superseded, all_attempts)


def failures_text(found: Failures) -> str:
    """What ``eagle3-datagen failures`` prints: the run, then one line per failed batch."""
    run, rows = found.run, found.rows
    state = run.state.type.value if run.state else "UNKNOWN"
    head = f"flow run {run.name!r} ({run.id}) {state}"
    if run.state and run.state.message and state != "COMPLETED":
        head += f": {failure_reason(run.state.message, state)}"  # whole: no mid-word cut
    if run.run_count > 1:
        head += f"; attempt {run.run_count}" + (
            ", all attempts below" if found.all_attempts else ""
        )
    lines = [head]
    if found.superseded:
        lines.append(
            f"({found.superseded} partition runs of earlier attempts left out: "
            f"eagle3-datagen failures {run.id} --all-attempts)"
        )
    if not rows:
        return "\n".join([*lines, "no failed batches"])
    lines += [f"{len(rows)} failed batches:", "batch\tlines\tattempts\tcause"]
    for row in rows:
        first, last = row.get("first_line"), row.get("last_line")
        span = f"{first}-{last}" if first is not None else "?"
        lines.append(f"{row['batch']}\t{span}\t{row.get('attempts', '?')}\t{row['cause']}")
    return "\n".join(lines)
