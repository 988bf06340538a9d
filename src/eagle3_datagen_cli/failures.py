"""What the command line asks the Prefect API: a run's failed batches, the automations.

``eagle3-datagen failures [FLOW_RUN]`` reads the failed-batches tables the partition subflows
write (and, for a partition still running or one that crashed before writing its table, the
failed batch task runs' own messages). ``eagle3-datagen alarm install --block NAME`` creates
the automations of ``automations/`` (throughput low, run failed; package data of
``eagle3_datagen_flows``, so they are there after ``pip install .``) with a named
notification block, so no placeholder id ever reaches the server. ``eagle3-datagen alarm
unschedulable`` creates the two that fail a run whose Kubernetes pod stays unschedulable.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any
from uuid import UUID

import yaml
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
from prefect.events.schemas.automations import AutomationCore

from eagle3_datagen.errors import ConfigError
from eagle3_datagen.report.ui import FAILED_BATCHES_PREFIX
from eagle3_datagen_flows.prefect_text import failure_reason

PARENT_FLOWS = ["eagle3-datagen", "eagle3-datagen-fanout"]
# Package data: the file installs with this package, so `alarm install` works from a wheel too.
ALARM_FILE = Path(str(resources.files("eagle3_datagen_flows") / "automations/throughput-low.yaml"))
# Every shipped automation: `alarm install` installs them all with the one block.
ALARM_FILES = [ALARM_FILE, ALARM_FILE.with_name("run-failed.yaml")]
# Kubernetes pools: a run whose pod is unschedulable goes to Unschedulable, then Failed.
UNSCHEDULABLE_FILES = [
    ALARM_FILE.with_name("pod-unschedulable.yaml"),
    ALARM_FILE.with_name("pod-unschedulable-failed.yaml"),
]
# How long a run may stay Unschedulable before it is failed (pod-unschedulable-failed.yaml says
# why 30 min); `alarm unschedulable --minutes` changes it.
UNSCHEDULABLE_MINUTES = 30.0


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


def automation_spec(path: Path, block_id: UUID) -> AutomationCore:
    """The automation file with the notification block's id in every send-notification."""
    spec = yaml.safe_load(path.read_text())
    for action in spec.get("actions", []):
        if action.get("type") == "send-notification":
            action["block_document_id"] = str(block_id)
    return AutomationCore.model_validate(spec)


async def _block_id(client: PrefectClient, block: str) -> tuple[UUID, str]:
    """A notification block by ``NAME`` or ``TYPE-SLUG/NAME`` (as ``prefect block ls`` shows)."""
    slug, _, name = block.rpartition("/")
    documents = [
        d
        for d in await client.read_block_documents()
        if d.name == name and (not slug or (d.block_type and d.block_type.slug == slug))
    ]
    if not documents:
        raise ConfigError(
            f"no block named {block!r} on this Prefect server; make one first (UI: Blocks > +, "
            "e.g. Slack Webhook), then pass its name (`prefect block ls`)"
        )
    if len(documents) > 1:
        kinds = sorted(f"{d.block_type.slug}/{d.name}" for d in documents if d.block_type)
        raise ConfigError(f"several blocks are named {name!r}: say which, one of {kinds}")
    doc = documents[0]
    kind = doc.block_type.slug if doc.block_type else "?"
    if doc.block_schema is not None and "notify" not in doc.block_schema.capabilities:
        raise ConfigError(f"block {kind}/{name} cannot send notifications")
    return doc.id, f"{kind}/{doc.name}"


async def _upsert(client: PrefectClient, automation: AutomationCore) -> tuple[str, UUID]:
    """Create the automation, or update the one of that name; ("created"|"updated", id)."""
    existing = await client.read_automations_by_name(automation.name)
    if existing:
        await client.update_automation(existing[0].id, automation)
        return "updated", existing[0].id
    return "created", await client.create_automation(automation)


def unschedulable_specs(minutes: float) -> list[AutomationCore]:
    """The two unschedulable-pod automations, the proactive one waiting ``minutes``."""
    if minutes * 60 < 10:
        raise ConfigError(f"--minutes {minutes}: Prefect waits at least 10 s (0.17 min)")
    specs = []
    for path in UNSCHEDULABLE_FILES:
        spec = yaml.safe_load(path.read_text())
        if spec["trigger"]["posture"] == "Proactive":
            spec["trigger"]["within"] = minutes * 60
        specs.append(AutomationCore.model_validate(spec))
    return specs


async def install_unschedulable(minutes: float = UNSCHEDULABLE_MINUTES) -> str:
    """Create (or update, by name) the unschedulable-pod automations; one line per automation."""
    lines = []
    async with get_client() as client:
        for automation in unschedulable_specs(minutes):
            done, automation_id = await _upsert(client, automation)
            lines.append(f"automation {automation.name!r} ({automation_id}) {done}")
    return "\n".join(lines) + f"\nruns whose pod stays unschedulable fail after {minutes:g} min"


async def install_alarms(block: str, paths: list[Path]) -> str:
    """Create (or update, by name) each automation file's automation with ``block``; one line
    per automation saying what was done."""
    return "\n".join([await install_alarm(block, path) for path in paths])


async def install_alarm(block: str, path: Path = ALARM_FILE) -> str:
    """Create (or update, by name) the file's automation with ``block``; says what it did."""
    async with get_client() as client:
        block_id, block_name = await _block_id(client, block)
        automation = automation_spec(path, block_id)
        done, automation_id = await _upsert(client, automation)
    return f"automation {automation.name!r} ({automation_id}) {done}: notifies through {block_name}"
