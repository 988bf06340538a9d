"""Retry from the dashboard, as an operator does it, and the failures the run then shows.

A real ``prefect server``, the README's deployments and process worker, and an emulator the
demo run attaches to by URL. The emulator answers the LONG tier slowly (some 8000 tokens at
1 ms each) and the run's request timeout is 2 s, so every demo_long batch runs out of tries
while demo_short and demo_images complete. The run is retried with the call the UI's Retry
button makes (``set_state`` AwaitingRetry); the second retry finds a healthy emulator on the
same port and completes.

Checked: completed partitions are reused, not run again; every subflow and batch task
carries only its own partition's tags after two retries; the parent's Artifacts tab holds the
attempt's failed-batches table, and after the successful retry the parent's and the
partition's failed-batches keys say they are superseded; a failed batch logs one ERROR line
and no traceback at ERROR anywhere in the run.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from eagle3_datagen.demo import demo_config
from tests.support import free_port
from tests.support.emulator import EmulatorProcess
from tests.support.prefect import PrefectServer

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

DEMO = "eagle3-datagen/demo"
ERROR = 40
# The LONG tier's answers take ~8 s, the SHORT tier's (16 tokens at most) ~16 ms.
SLOW_LONG = ["--emu-mean-output-tokens", "8000", "--emu-output-sigma", "0.05"]
SLOW_LONG += ["--emu-decode-ms-per-token", "1"]


def _retry(srv: PrefectServer, run_id: str) -> dict[str, Any]:
    """The UI's Retry: the request its button sends; then a worker runs the run again."""
    srv.post(
        f"/flow_runs/{run_id}/set_state",
        {
            "state": {"type": "SCHEDULED", "name": "AwaitingRetry", "message": "Retry from the UI"},
            "force": False,
        },
    )
    return srv.wait_final(run_id, timeout=300)


def _subflows(srv: PrefectServer, run_id: str) -> list[dict[str, Any]]:
    body = {"flow_runs": {"parent_flow_run_id": {"any_": [run_id]}}}
    return list(srv.post("/flow_runs/filter", body))


def _partition(run: dict[str, Any]) -> str:
    return str(run["parameters"]["partition"])


def _versions(srv: PrefectServer, key: str, run_ids: list[str]) -> list[dict[str, Any]]:
    """Every version of ``key`` made by these runs, oldest first."""
    found = srv.post(
        "/artifacts/filter",
        {"artifacts": {"key": {"any_": [key]}, "flow_run_id": {"any_": run_ids}}},
    )
    return sorted(found, key=lambda a: a["created"])


def _rows(artifact: dict[str, Any]) -> list[dict[str, Any]]:
    data = artifact["data"]
    return list(json.loads(data) if isinstance(data, str) else data)


def _logs(srv: PrefectServer, **match: list[str]) -> list[dict[str, Any]]:
    body = {"logs": {field: {"any_": ids} for field, ids in match.items()}, "limit": 200}
    return list(srv.post("/logs/filter", body))


def test_a_retry_reuses_labels_and_supersedes(
    prefect_server: PrefectServer, deployed: Path, tmp_path: Path
) -> None:
    srv = prefect_server
    port = free_port()
    (tmp_path / "slow").mkdir()
    slow = EmulatorProcess(*SLOW_LONG, port=port, log_dir=tmp_path / "slow").wait_ready()
    config = demo_config(tmp_path / "out").model_dump(mode="json")
    config["tiers"][0]["max_tokens"] = 16  # SHORT
    config["server"]["limits"]["request_timeout_s"] = 2
    config["server"]["recovery"]["lost_after_failures"] = 1000
    config["retries"].update(
        max_attempts=1, backoff_initial_s=0.1, batch_retries=1, batch_retry_delay_s=[0.2]
    )
    params = {"config": config, "server_url": slow.url}
    try:
        run_id = srv.run_deployment(DEMO, params)
        first = srv.wait_final(run_id, timeout=300)
        assert first["state_type"] == "FAILED", first["state"]
        states = {_partition(s): s["state_type"] for s in _subflows(srv, run_id)}
        assert states == {
            "demo_short": "COMPLETED",
            "demo_images": "COMPLETED",
            "demo_long": "FAILED",
        }

        # The parent's Artifacts tab: this attempt's failed batches, each partition's linked.
        [table] = _versions(srv, "failed-batches", [run_id])
        rows = _rows(table)
        assert [r["batch"] for r in rows] == ["0000", "0001"], rows
        assert all(r["partition"].startswith("[demo_long](") for r in rows), rows
        # What an operator decides on first leads (on screen at 1400 px).
        assert list(rows[0])[:4] == ["status", "cause", "attempts", "partition"], rows
        assert "timeout" in rows[0]["cause"] and rows[0]["attempts"] == 2, rows
        # The summary leads with what an operator reads first.
        [summary] = _versions(srv, "datagen-summary", [run_id])
        assert list(_rows(summary)[0])[:4] == ["partition", "status", "on_disk", "error"]

        # A failed batch: one ERROR line, with its cause; no traceback at ERROR in the run.
        failed_sub = next(s for s in _subflows(srv, run_id) if s["state_type"] == "FAILED")
        query = {
            "flow_runs": {"id": {"any_": [failed_sub["id"]]}},
            "task_runs": {"state": {"type": {"any_": ["FAILED"]}}},
        }
        batch = next(
            t for t in srv.post("/task_runs/filter", query) if t["name"].startswith("generate[")
        )
        errors = [
            e["message"] for e in _logs(srv, task_run_id=[batch["id"]]) if e["level"] >= ERROR
        ]
        assert len(errors) == 1 and "timeout" in errors[0], errors
        print(f"failed batch's ERROR line: {errors[0]}")
        print(f"parent's failed-batches after attempt 1: {table['description']}: {rows}")
        run_logs = _logs(srv, flow_run_id=[run_id, *(s["id"] for s in _subflows(srv, run_id))])
        tracebacks = [
            e["message"] for e in run_logs if e["level"] >= ERROR and "Traceback" in e["message"]
        ]
        assert not tracebacks, tracebacks[0]

        second = _retry(srv, run_id)  # demo_long still times out
        assert (second["state_type"], second["run_count"]) == ("FAILED", 2), second["state"]
    finally:
        slow.stop()
    (tmp_path / "healthy").mkdir()
    healthy = EmulatorProcess(port=port, log_dir=tmp_path / "healthy").wait_ready()
    try:
        final = _retry(srv, run_id)
    finally:
        healthy.stop()
    assert (final["state_type"], final["run_count"]) == ("COMPLETED", 3), final["state"]

    # Reused, not run again: one subflow for each partition the first attempt completed.
    subs = _subflows(srv, run_id)
    assert Counter(_partition(s) for s in subs) == {
        "demo_short": 1,
        "demo_images": 1,
        "demo_long": 3,
    }
    [summary] = _versions(srv, "datagen-summary", [run_id])[-1:]
    status = {r["partition"]: r["status"] for r in _rows(summary)}
    assert status == {"demo_short": "reused", "demo_images": "reused", "demo_long": "completed"}
    starts = [e["message"] for e in _logs(srv, flow_run_id=[run_id])]
    assert any(m.startswith("attempt 3 of this run (a retry)") for m in starts), starts

    # Tags: each subflow and batch carries its own partition's tag and tier only.
    tiers = {"demo_short": "SHORT", "demo_images": "SHORT", "demo_long": "LONG"}
    for sub in subs:
        own = {f"partition:{_partition(sub)}", f"tier:{tiers[_partition(sub)]}"}
        scoped = {t for t in sub["tags"] if t.startswith(("partition:", "tier:"))}
        print(f"{sub['name']} tags: {sorted(sub['tags'])}")
        assert scoped == own, sub["tags"]
        tasks = srv.post("/task_runs/filter", {"flow_runs": {"id": {"any_": [sub["id"]]}}})
        for task in tasks:
            assert {t for t in task["tags"] if t.startswith(("partition:", "tier:"))} == own
    tagged = srv.post(
        "/flow_runs/filter",
        {
            "flow_runs": {
                "tags": {"all_": ["partition:demo_short"]},
                "parent_flow_run_id": {"any_": [run_id]},
            }
        },
    )
    assert [_partition(r) for r in tagged] == ["demo_short"]

    # Superseded: the parent's failed-batches key and the partition's, each version marked,
    # and the key's latest version (what the Artifacts page shows) says so, with no rows.
    sub_ids = [s["id"] for s in subs]
    for key, runs in (("failed-batches", [run_id]), ("failed-batches-demo-long", sub_ids)):
        versions = _versions(srv, key, runs)
        assert len(versions) == 3, [v["description"] for v in versions]
        assert all(v["description"].startswith("Superseded by ") for v in versions), versions
        assert _rows(versions[-1]) == [] and versions[-1]["description"].endswith(
            "all batches committed"
        ), versions[-1]["description"]
        print(f"{key} versions:", *(v["description"] for v in versions), sep="\n  ")
        [latest] = srv.post("/artifacts/latest/filter", {"artifacts": {"key": {"any_": [key]}}})
        assert latest["latest_id"] == versions[-1]["id"], latest
