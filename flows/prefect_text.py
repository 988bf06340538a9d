"""Prefect's own formats, in one place: state-message preambles, event resources, artifact keys
and links. The library's wording (``eagle3_datagen.report.ui``) knows none of them."""

from __future__ import annotations

import re
from typing import Any

from eagle3_datagen.report.throughput import ThroughputChange
from eagle3_datagen.report.ui import THROUGHPUT_EVENT_PREFIX


def artifact_key(prefix: str, name: str) -> str:
    """An artifact key (Prefect allows only ``[a-z0-9-]``) made from a partition name."""
    return prefix + "-" + "".join(c if c.isalnum() else "-" for c in name.lower())


def throughput_event(
    change: ThroughputChange,
    *,
    flow_run_id: str,
    flow_run_name: str,
    flow_id: str,
    deployment_id: str | None,
) -> dict[str, Any]:
    """The Prefect event of an alarm transition, as ``emit_event``'s keyword arguments.

    The resource is the flow run, related to its flow and deployment, so an automation can
    match on any of them; the payload is the numbers (automations can template them).
    """
    related = [{"prefect.resource.id": f"prefect.flow.{flow_id}", "prefect.resource.role": "flow"}]
    if deployment_id:
        related.append(
            {
                "prefect.resource.id": f"prefect.deployment.{deployment_id}",
                "prefect.resource.role": "deployment",
            }
        )
    return {
        "event": f"{THROUGHPUT_EVENT_PREFIX}.{change.kind}",
        "resource": {
            "prefect.resource.id": f"prefect.flow-run.{flow_run_id}",
            "prefect.resource.name": flow_run_name,
            "prefect.resource.role": "flow-run",
        },
        "related": related,
        "payload": change.payload(),
    }


_ERROR_CLASS = re.compile(r"^[A-Z][A-Za-z]*(?:Failed|Error|Lost): ")
_STATE_PREFIXES = (
    "Flow run encountered an exception: ",
    "Task run encountered an exception ",
)


def failure_reason(message: str | None, fallback: str) -> str:
    """A failed state's message without Prefect's preamble, for the parent's own message."""
    text = (message or "").strip()
    for prefix in _STATE_PREFIXES:
        text = text.removeprefix(prefix)
    text = _ERROR_CLASS.sub("", text, count=1)  # "RunFailed: ", "ServerLost: ", ...
    return " ".join(text.split()) or fallback


def artifact_link(ui_url: str | None, artifact_id: str) -> str:
    """The artifact's page in the Prefect UI (relative to the UI when its URL is unknown)."""
    return f"{(ui_url or '').rstrip('/')}/artifacts/artifact/{artifact_id}"
