"""A partition job whose pod never schedules fails with the scheduler's reason, and the fan-out
waiting on it fails naming it: a real ``prefect server``, the automations ``eagle3-datagen alarm
unschedulable`` installs, and the real fan-out parent (``eagle3-datagen run --fan-out``).

The pod events come from prefect-kubernetes's own observer handler, fed the watch events of a
pod that kube-scheduler marks Unschedulable (tests/support/k8s_observer.py): the event with its
``kubernetes.diagnosis`` label, the InfrastructurePending proposal and the diagnosis log line
are the observer's. No Kubernetes worker picks the job up; the test does what it would (the run
to Pending, then its pod's events). Three runs at once: the fan-out's job, whose pod stays
unschedulable, ends Failed naming the diagnosis; one whose pod starts after being unschedulable
keeps Running; one whose pod is only Pending (no diagnosis: an image still pulling) is never
touched.
"""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support import REPO, TOKENIZER_DIR, wait_until
from tests.support.prefect import PrefectServer

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

WINDOW_S = 15  # --minutes 0.25: Prefect's proactive triggers wait at least 10 s
SCHEDULER = (
    "Pod is unschedulable: Kubernetes cannot find a suitable node to run this pod. 0/8 nodes "
    "are available: 8 Insufficient nvidia.com/gpu."
)
FAILED = "Unschedulable: Kubernetes could not schedule this run's pod in the time allowed"


def _fanout(srv: PrefectServer, tmp_path: Path) -> subprocess.Popen[str]:
    """``eagle3-datagen run CONFIG --fan-out eagle3-datagen/partition-job-k8s``, one partition."""
    (tmp_path / "b1.jsonl").write_text(
        '{"id": "b1-0", "messages": [{"role": "user", "content": "hi"}]}\n'
    )
    config = {
        "model": {"path": str(TOKENIZER_DIR)},
        "server": {"mode": "launch", "engine": "emulator"},
        "tiers": [{"name": "SHORT", "concurrency": 8, "max_tokens": 1024}],
        "partitions": [{"name": "B1", "input": str(tmp_path / "b1.jsonl"), "tier": "SHORT"}],
        "output_dir": str(tmp_path / "out"),
    }
    (tmp_path / "cfg.yaml").write_text(yaml.safe_dump(config))
    exe = Path(sys.executable).with_name("eagle3-datagen")
    deployment = "eagle3-datagen/partition-job-k8s"
    return subprocess.Popen(
        [str(exe), "run", str(tmp_path / "cfg.yaml"), "--fan-out", deployment],
        cwd=REPO,
        env=srv.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _observe(srv: PrefectServer, run: dict[str, Any], *pods: str) -> None:
    """The worker's observer seeing the watch events of ``RUN_ID/POD_UID/EVENT,...`` pods."""
    args = [run["flow_id"], run["deployment_id"], *pods]
    proc = subprocess.run(
        [sys.executable, "-m", "tests.support.k8s_observer", *args],
        cwd=REPO,
        env=srv.env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def _state(srv: PrefectServer, run: dict[str, Any]) -> dict[str, Any]:
    return dict(srv.get(f"/flow_runs/{run['id']}")["state"])


def test_unschedulable_pod_fails_its_run_and_the_fanout_with_the_diagnosis(
    prefect_server: PrefectServer, tmp_path: Path
) -> None:
    srv = prefect_server
    out = srv.datagen("alarm", "unschedulable", "--minutes", str(WINDOW_S / 60))
    assert "'eagle3-datagen pod unschedulable' (" in out, out
    assert "'eagle3-datagen pod unschedulable too long' (" in out, out
    fanout, dep = None, None
    try:
        flow_id = srv.post("/flows/", {"name": "eagle3-datagen"})["id"]
        dep = srv.post("/deployments/", {"name": "partition-job-k8s", "flow_id": flow_id})["id"]
        fanout = _fanout(srv, tmp_path)
        jobs: list[dict[str, Any]] = []

        def job_started() -> bool:
            jobs[:] = srv.post(
                "/flow_runs/filter", {"flow_runs": {"deployment_id": {"any_": [dep]}}}
            )
            return bool(jobs) or fanout.poll() is not None

        wait_until(job_started, 180, 1)
        assert len(jobs) == 1, fanout.communicate()[0][-3000:]
        runs = {"stuck": jobs[0]}
        for name in ("starts", "pulling"):
            runs[name] = srv.post(f"/deployments/{dep}/create_flow_run", {"name": f"pod-{name}"})
        for run in runs.values():  # what the worker does before it creates the Job
            srv.post(f"/flow_runs/{run['id']}/set_state", {"state": {"type": "PENDING"}})
        uids = {name: str(uuid.uuid4()) for name in runs}
        seen = {
            "stuck": "created,unschedulable",
            "starts": "created,unschedulable",
            "pulling": "created",
        }
        _observe(srv, runs["stuck"], *(f"{runs[n]['id']}/{uids[n]}/{e}" for n, e in seen.items()))

        wait_until(
            lambda: all(
                _state(srv, runs[n])["name"] == "Unschedulable" for n in ("stuck", "starts")
            ),
            120,
            1,
        )
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
        assert message.startswith(FAILED) and "Pod is unschedulable:" in message, message
        logs = srv.post("/logs/filter", {"logs": {"flow_run_id": {"any_": [runs["stuck"]["id"]]}}})
        assert any(SCHEDULER in log["message"] for log in logs), [x["message"] for x in logs]

        # The fan-out parent, which waited on that job, fails naming it and its reason.
        output = fanout.communicate(timeout=120)[0]
        assert fanout.returncode != 0, output[-3000:]
        task_run = srv.get(f"/task_runs/{jobs[0]['parent_task_run_id']}")
        parent = srv.get(f"/flow_runs/{task_run['flow_run_id']}")
        assert parent["state_type"] == "FAILED", parent
        reason = f"1 of 1 partition jobs failed: B1: {FAILED}"
        assert reason in parent["state"]["message"], parent["state"]["message"]
        assert "Unschedulable: Kubernetes could not schedule" in output, output[-3000:]

        # Past the window of "starts" too (it began with that of "stuck"), with a margin.
        time.sleep(max(0.0, marked + WINDOW_S + 10 - time.monotonic()))
        assert _state(srv, runs["starts"])["type"] == "RUNNING"
        pulling = _state(srv, runs["pulling"])
        assert (pulling["type"], pulling["name"]) == ("PENDING", "InfrastructurePending")
    finally:
        if fanout is not None and fanout.poll() is None:
            fanout.kill()
        for automation in srv.post("/automations/filter"):
            if automation["name"].startswith("eagle3-datagen pod unschedulable"):
                srv.delete(f"/automations/{automation['id']}")
        if dep is not None:  # the shared server's other tests expect only README's deployments
            srv.delete(f"/deployments/{dep}")
