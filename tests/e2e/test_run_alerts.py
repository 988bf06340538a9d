"""The shipped run-failed automation on a real ``prefect server`` with a real webhook block:
a deployment run of the pipeline that ends Failed or Crashed notifies once, with its reason; a
completed run, a run of another flow and a run outside a deployment do not."""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from collections.abc import Iterator

import pytest

from tests.support.prefect import Hook, PrefectServer

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

BLOCK = "e2e-run-alerts"
AUTOMATION = "eagle3-datagen run failed"


@pytest.fixture
def hook(prefect_server: PrefectServer) -> Iterator[Hook]:
    """A webhook block pointing at a local receiver; the automation and block go at the end."""
    srv = prefect_server
    hook = Hook()
    code = (
        "from prefect.blocks.notifications import CustomWebhookNotificationBlock as B\n"
        f"B(name='e2e', url={hook.url!r}, json_data={{'text': '{{{{subject}}}}|{{{{body}}}}'}})"
        f".save({BLOCK!r}, overwrite=True)\n"
    )
    subprocess.run([sys.executable, "-c", code], env=srv.env, check=True, timeout=120)
    yield hook
    for automation in srv.post("/automations/filter"):
        if automation["name"] in (AUTOMATION, "eagle3-datagen throughput low"):
            srv.delete(f"/automations/{automation['id']}")
    for deployment in srv.post("/deployments/filter"):  # this test's own (see _run)
        if deployment["name"].startswith(("nightly-", "fanout-", "other-")):
            srv.delete(f"/deployments/{deployment['id']}")
    hook.server.shutdown()


def _run(srv: PrefectServer, flow: str, deployment: str | None, name: str) -> str:
    flow_id = srv.post("/flows/", {"name": flow})["id"]
    if deployment is None:
        return str(srv.post("/flow_runs/", {"flow_id": flow_id, "name": name})["id"])
    dep = srv.post("/deployments/", {"name": deployment, "flow_id": flow_id})["id"]
    return str(srv.post(f"/deployments/{dep}/create_flow_run", {"name": name})["id"])


def _end(srv: PrefectServer, run_id: str, state: str, message: str = "") -> None:
    """What a worker's runner reports: Running, then the final state."""
    for body in ({"type": "RUNNING"}, {"type": state, "message": message}):
        result = srv.post(f"/flow_runs/{run_id}/set_state", {"state": body, "force": True})
        assert result["status"] == "ACCEPT", result


def test_failed_and_crashed_deployment_runs_notify(
    prefect_server: PrefectServer, hook: Hook
) -> None:
    srv = prefect_server
    out = srv.datagen("alarm", "install", "--block", BLOCK)  # both shipped automations
    assert "'eagle3-datagen throughput low'" in out and f"'{AUTOMATION}'" in out, out
    assert f"'{AUTOMATION}'" in out and f"notifies through custom-webhook/{BLOCK}" in out, out
    tag = uuid.uuid4().hex[:6]
    # Deployments of this test's own (no work pool): the server's real "nightly" deployment,
    # which other e2e tests run through a worker, is neither overwritten nor picked up here.
    failed = _run(srv, "eagle3-datagen", f"nightly-{tag}", f"failed-{tag}")
    crashed = _run(srv, "eagle3-datagen-fanout", f"fanout-{tag}", f"crashed-{tag}")
    quiet = [
        (_run(srv, "eagle3-datagen", f"nightly-{tag}", f"completed-{tag}"), "COMPLETED"),
        (_run(srv, "eagle3-datagen", None, f"adhoc-{tag}"), "FAILED"),  # no deployment
        (_run(srv, "some-other-flow", f"other-{tag}", f"other-{tag}"), "FAILED"),
    ]
    time.sleep(2)  # the automation is loaded by the triggers service
    _end(srv, failed, "FAILED", "1 of 2 partitions failed: B1: disk full")
    _end(srv, crashed, "CRASHED", "Execution was interrupted by an unexpected exception")
    for run_id, state in quiet:
        _end(srv, run_id, state, "not for the alarm")

    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        mine = [body for body in hook.received if tag in body]
        if len(mine) >= 2:
            break
        time.sleep(0.5)
    time.sleep(5)  # anything else it would send comes within this
    mine = [body for body in hook.received if tag in body]
    assert len(mine) == 2, mine
    by_run = {
        name: next(b for b in mine if f"{name}-{tag} " in b) for name in ("failed", "crashed")
    }
    assert (
        f"eagle3-datagen: failed-{tag} Failed|nightly-{tag} run failed-{tag} ended Failed"
        in (by_run["failed"])
    )
    assert "1 of 2 partitions failed: B1: disk full" in by_run["failed"]
    # The id (and the UI link where the server knows its UI_URL) to find the run by.
    assert f"flow run id {failed}; `eagle3-datagen failures {failed}`" in by_run["failed"]
    assert "None" not in by_run["failed"]
    assert f"crashed-{tag} ended Crashed" in by_run["crashed"]
    assert "not for the alarm" not in "".join(hook.received)
