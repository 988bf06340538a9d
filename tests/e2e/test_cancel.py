"""Cancelling a deployment run mid-partition from Prefect stops the server it launched, and the
run keeps its own Cancelled message although the worker writes the last state."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from eagle3_datagen.demo import demo_config
from eagle3_datagen.processes import pid_alive
from eagle3_datagen_flows.stopping import RUNNER_CANCELLED
from tests.support import REPO
from tests.support.prefect import PrefectServer

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def test_cancelled_run_leaves_no_server_process(
    prefect_server: PrefectServer, deployed: Path, tmp_path: Path
) -> None:
    srv = prefect_server
    config = demo_config(tmp_path / "out").model_dump(mode="json")
    # Slow enough that the run is still generating when we cancel it.
    config["server"]["extra_args"] += [
        "--emu-decode-ms-per-token",
        "50",
        "--emu-running-slots",
        "2",
    ]
    run_id = srv.run_deployment("eagle3-datagen/demo", {"config": config})

    ledger = tmp_path / "out" / "emulator-ledger.jsonl"
    state_dir = tmp_path / "out" / ".state" / "servers"
    deadline = time.monotonic() + 240
    while not (ledger.exists() and ledger.read_bytes().count(b"\n") >= 3):
        assert time.monotonic() < deadline, srv.get(f"/flow_runs/{run_id}")["state"]
        time.sleep(0.5)
    [pidfile] = list(state_dir.glob("*.json"))
    pid = json.loads(pidfile.read_text())["pid"]
    assert pid_alive(pid)

    srv.cli("flow-run", "cancel", run_id)
    run = srv.wait_final(run_id, timeout=180)
    assert run["state_type"] == "CANCELLED"
    # The summary says cancelled, not "failed: run stopped before it finished: 15".
    [summary] = srv.post(
        "/artifacts/filter",
        {"artifacts": {"key": {"any_": ["datagen-summary"]}, "flow_run_id": {"any_": [run_id]}}},
    )
    rows = json.loads(summary["data"]) if isinstance(summary["data"], str) else summary["data"]
    assert {r["status"] for r in rows} <= {"cancelled", "completed"}, rows
    assert "cancelled" in {r["status"] for r in rows} and "CANCELLED" in summary["description"]
    deadline = time.monotonic() + 60
    while pid_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not pid_alive(pid), f"server pid {pid} outlived its cancelled run"
    assert not list(state_dir.glob("*.json")), "the pidfile was cleaned up"
    _keeps_its_own_message(srv, run_id)


def _messages(srv: PrefectServer, run_id: str) -> list[str]:
    """The run's Cancelled states' messages, oldest first."""
    states = srv.get(f"/flow_run_states/?flow_run_id={run_id}")
    ordered = sorted(states, key=lambda s: s["timestamp"])
    return [s["message"] or "" for s in ordered if s["type"] == "CANCELLED"]


def _keeps_its_own_message(srv: PrefectServer, run_id: str) -> None:
    """The worker's runner writes its own Cancelled state once the run's process has exited
    (some seconds after the run ended); wait for it, then the run's own message is the last."""
    deadline = time.monotonic() + 180
    while RUNNER_CANCELLED not in (said := _messages(srv, run_id)) or said[-1] == RUNNER_CANCELLED:
        assert time.monotonic() < deadline, said
        time.sleep(0.5)
    own = said[-1]
    assert own.startswith("stopped before it finished:") and "a rerun finishes" in own, said
    assert srv.get(f"/flow_runs/{run_id}")["state"]["message"] == own
    failures = subprocess.run(
        [sys.executable, "-m", "eagle3_datagen_cli.main", "failures", run_id],
        cwd=REPO,
        env=srv.env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert own in failures.stdout and RUNNER_CANCELLED not in failures.stdout, (
        failures.stdout + failures.stderr
    )
