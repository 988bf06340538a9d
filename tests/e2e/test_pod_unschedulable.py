"""A partition job whose pod never schedules fails with the scheduler's reason, on a real
``prefect server`` with the automations ``eagle3-datagen alarm unschedulable`` installs.

The pod events come from prefect-kubernetes's own observer handler, fed the watch events of a
pod that kube-scheduler marks Unschedulable (tests/support/k8s_observer.py): the event with its
``kubernetes.diagnosis`` label, the InfrastructurePending proposal and the diagnosis log line
are the observer's. Three runs at once: the unschedulable one ends Failed naming the diagnosis;
one whose pod starts after being unschedulable keeps Running; one whose pod is only Pending
(no diagnosis: an image still pulling) is never touched.
"""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.support import REPO, wait_until
from tests.support.prefect import PrefectServer

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

WINDOW_S = 15  # --minutes 0.25: Prefect's proactive triggers wait at least 10 s
SCHEDULER = (
    "Pod is unschedulable: Kubernetes cannot find a suitable node to run this pod. 0/8 nodes "
    "are available: 8 Insufficient nvidia.com/gpu."
)


def _datagen(srv: PrefectServer, *args: str) -> str:
    exe = Path(sys.executable).with_name("eagle3-datagen")
    proc = subprocess.run([str(exe), *args], cwd=REPO, env=srv.env, capture_output=True,
                          text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def _observe(srv: PrefectServer, run: dict[str, Any], *pods: str) -> None:
    """The worker's observer seeing the watch events of ``RUN_ID/POD_UID/EVENT,...`` pods."""
    args = [run["flow_id"], run["deployment_id"], *pods]
    proc = subprocess.run([sys.executable, "-m", "tests.support.k8s_observer", *args], cwd=REPO,
                          env=srv.env, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr


def _state(srv: PrefectServer, run: dict[str, Any]) -> dict[str, Any]:
    return dict(srv.get(f"/flow_runs/{run['id']}")["state"])


def test_unschedulable_pod_fails_its_run_with_the_diagnosis(
    prefect_server: PrefectServer,
) -> None:
    srv = prefect_server
    out = _datagen(srv, "alarm", "unschedulable", "--minutes", str(WINDOW_S / 60))
    assert "'eagle3-datagen pod unschedulable' (" in out, out
    assert "'eagle3-datagen pod unschedulable too long' (" in out, out
    try:
        flow_id = srv.post("/flows/", {"name": "eagle3-datagen"})["id"]
        dep = srv.post("/deployments/", {"name": "partition-job-k8s", "flow_id": flow_id})["id"]
        runs = {}
        for name in ("stuck", "starts", "pulling"):
            run = srv.post(f"/deployments/{dep}/create_flow_run", {"name": f"pod-{name}"})
            # what the worker does before it creates the Job
            srv.post(f"/flow_runs/{run['id']}/set_state", {"state": {"type": "PENDING"}})
            runs[name] = run
        uids = {name: str(uuid.uuid4()) for name in runs}
        seen = {"stuck": "created,unschedulable", "starts": "created,unschedulable",
                "pulling": "created"}  # fmt: skip
        _observe(srv, runs["stuck"], *(f"{runs[n]['id']}/{uids[n]}/{e}" for n, e in seen.items()))

        try:
            wait_until(lambda: all(_state(srv, runs[n])["name"] == "Unschedulable"
                                   for n in ("stuck", "starts")), 120, 1)  # fmt: skip
        except TimeoutError:
            states = {n: _state(srv, r)["name"] for n, r in runs.items()}
            events = srv.post("/events/filter", {"limit": 50})["events"]
            raise AssertionError(
                f"{states}\n{[(e['event'], e['resource']) for e in events]}"
            ) from None
        marked = time.monotonic()
        # The pod of "starts" gets a node: its engine reports Running, the observer the pod.
        result = srv.post(
            f"/flow_runs/{runs['starts']['id']}/set_state", {"state": {"type": "RUNNING"}}
        )
        assert result["status"] == "ACCEPT", result
        _observe(srv, runs["starts"], f"{runs['starts']['id']}/{uids['starts']}/running")

        final = srv.wait_final(runs["stuck"]["id"], timeout=180)
        assert final["state_type"] == "FAILED", final
        message = final["state"]["message"]
        assert message.startswith("Unschedulable: "), message
        assert "Pod is unschedulable:" in message and "kubernetes.diagnosis" not in message
        logs = srv.post("/logs/filter", {"logs": {"flow_run_id": {"any_": [runs["stuck"]["id"]]}}})
        assert any(SCHEDULER in log["message"] for log in logs), [x["message"] for x in logs]

        # Past the window of "starts" too (it began with that of "stuck"), with a margin.
        time.sleep(max(0.0, marked + WINDOW_S + 10 - time.monotonic()))
        assert _state(srv, runs["starts"])["type"] == "RUNNING"
        pulling = _state(srv, runs["pulling"])
        assert (pulling["type"], pulling["name"]) == ("PENDING", "InfrastructurePending")
    finally:
        for automation in srv.post("/automations/filter"):
            if automation["name"].startswith("eagle3-datagen pod unschedulable"):
                srv.delete(f"/automations/{automation['id']}")
