"""``concurrency: auto``'s limit changes in the Prefect UI: an event per change (as it happens)
and the run's ``auto-concurrency`` table artifact (the rows come from the library's
controller, ``sglang/concurrency.py``)."""

from __future__ import annotations

from typing import Any

from prefect.artifacts import acreate_table_artifact
from prefect.client.schemas.objects import FlowRun
from prefect.events import emit_event

from eagle3_datagen.sglang.concurrency import ConcurrencyController

AUTO_CONCURRENCY_KEY = "auto-concurrency"
LIMIT_EVENT = "eagle3-datagen.concurrency.limit-changed"


def emit_limit_changes(controller: ConcurrencyController | None, flow_run: FlowRun) -> None:
    """From now on, each change of the limit is a Prefect event on the flow run (payload: the
    table's row)."""
    if controller is None:
        return
    resource = {
        "prefect.resource.id": f"prefect.flow-run.{flow_run.id}",
        "prefect.resource.name": flow_run.name,
        "prefect.resource.role": "flow-run",
    }

    def emit(row: dict[str, Any]) -> None:
        emit_event(event=LIMIT_EVENT, resource=resource, payload=row)

    controller.on_change = emit


async def publish_limit_changes(controller: ConcurrencyController | None) -> None:
    """The table of every change of the limit this run made (none: no artifact)."""
    if controller is None or not controller.changes:
        return
    rows = controller.changes
    last = rows[-1]
    await acreate_table_artifact(
        rows,
        key=AUTO_CONCURRENCY_KEY,
        description=(
            f"concurrency auto: {len(rows)} changes of the limit, last {last['previous']} -> "
            f"{last['limit']} at {last['time']} ({last['reason']}); load read from "
            f"{last['source']}"
        ),
    )
