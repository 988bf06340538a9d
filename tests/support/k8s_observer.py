"""Pod watch events replayed through prefect-kubernetes's own observer handler
(``observer._replicate_pod_event``, the function kopf calls for each pod event), its Prefect
clients pointed at ``PREFECT_API_URL``: the events, InfrastructurePending proposals and
diagnosis log lines a worker's observer would send for that pod.

``python -m tests.support.k8s_observer FLOW_ID DEPLOYMENT_ID RUN_ID/POD_UID/EVENT,EVENT...``:
for each run, its pod's watch events in order, each EVENT a key of
``tests/fixtures/kubernetes/pod-unschedulable-events.json``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
from datetime import UTC, datetime
from typing import Any

from tests.support import REPO

FIXTURES = REPO / "tests" / "fixtures" / "kubernetes"


def pod_labels(flow_run_id: str, flow_id: str, deployment_id: str) -> dict[str, str]:
    """The pod template's labels of the rendered partition-job Job, with real ids."""
    job = json.loads((FIXTURES / "partition-job-k8s.json").read_text())
    labels: dict[str, str] = job["spec"]["template"]["metadata"]["labels"]
    fill = {
        "<flow-run-id>": flow_run_id,
        "<flow-id>": flow_id,
        "<deployment-id>": deployment_id,
        "<work-pool-id>": "00000000-0000-4000-8000-000000000000",
        "<deployment-updated>": "2026-12-01T00:00:00Z",
    }
    return {k: fill.get(v, v) for k, v in labels.items()}


def watch_event(name: str, uid: str) -> dict[str, Any]:
    """A fixture's watch event with this pod's uid and the current time."""
    text = (FIXTURES / "pod-unschedulable-events.json").read_text()
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    event: dict[str, Any] = json.loads(text.replace("<uid>", uid).replace("<now>", now))[name]
    return event


async def replay(flow_id: str, deployment_id: str, pods: list[str]) -> None:
    """Each ``RUN_ID/POD_UID/EVENT,...`` of ``pods`` through the observer's pod handler."""
    from prefect.client.orchestration import get_client
    from prefect.events.clients import get_events_client
    from prefect.logging.handlers import APILogHandler
    from prefect_kubernetes import observer

    async with get_client() as client, get_events_client() as events:
        observer.orchestration_client = client
        observer.events_client = events
        for pod in pods:
            run_id, uid, names = pod.split("/")
            labels = pod_labels(run_id, flow_id, deployment_id)
            for name in names.split(","):
                event = watch_event(name, uid)
                meta = event["object"]["metadata"]
                await observer._replicate_pod_event(
                    event=event,
                    uid=uid,
                    name=meta["name"],
                    namespace=meta["namespace"],
                    labels=labels,
                    status=event["object"]["status"],
                    logger=logging.getLogger("kopf.objects"),
                )
    await APILogHandler.aflush()  # the diagnosis line goes to the run's log before exit


if __name__ == "__main__":
    asyncio.run(replay(sys.argv[1], sys.argv[2], sys.argv[3:]))
