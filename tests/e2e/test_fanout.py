"""Partitions across machines: a fan-out over a work pool with two workers, each partition once.

Two process workers stand in for two GPU nodes (``--limit 1``: one partition job, one server
at a time each); every job launches its own emulator on a free port and writes to one shared
output directory. A retried fan-out (same flow run) must not run any partition again.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
import yaml

from eagle3_datagen.demo import TOKENIZER_DIR
from tests.support import REPO
from tests.support.prefect import PrefectServer
from tests.support.servers import wait_gone

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def write_partition(path: Path, prefix: str, n: int) -> list[str]:
    ids = [f"{prefix}-{i:03d}" for i in range(n)]
    path.write_text(
        "".join(
            json.dumps({"id": pid, "messages": [{"role": "user", "content": f"{prefix} {i}"}]})
            + "\n"
            for i, pid in enumerate(ids)
        )
    )
    return ids


def fanout_deployment(srv: PrefectServer) -> list[dict[str, Any]]:
    """The ``gpu-fanout`` process pool and the ``partition-job`` deployment on it, as
    deployments/prefect.yaml defines it; returns the deployment (a one-item list)."""
    srv.cli("work-pool", "create", "gpu-fanout", "--type", "process", check=False)
    out = srv.cli(
        "--no-prompt",
        "deploy",
        "--name",
        "partition-job",
        "--pool",
        "gpu-fanout",
        "--prefect-file",
        "deployments/prefect.yaml",
    )
    assert "partition-job" in out
    deps = srv.post("/deployments/filter", {"deployments": {"name": {"any_": ["partition-job"]}}})
    return list(deps)


def start_fanout_worker(srv: PrefectServer, name: str, tmp_path: Path) -> None:
    """One process worker of the pool, one job at a time: a GPU node."""
    srv.start(
        "worker",
        "start",
        "--pool",
        "gpu-fanout",
        "--name",
        name,
        "--limit",
        "1",
        log=tmp_path / f"{name}.log",
    )


def fanout_config(
    tmp_path: Path, names: str, *, slots: int, decode_ms: int, in_flight: int, out: str
) -> tuple[Path, Path]:
    """A config whose partitions (one per letter of ``names``) each launch their own emulator
    (``slots`` running requests, ``decode_ms`` a token), send ``in_flight`` requests at a time
    and share one output directory under ``tmp_path``; returns (config file, its output)."""
    config: dict[str, Any] = {
        "model": {"path": str(TOKENIZER_DIR)},
        "server": {
            "mode": "launch",
            "engine": "emulator",
            "port": 0,
            "startup_timeout_s": 60,
            "extra_args": [
                "--emu-running-slots",
                str(slots),
                "--emu-decode-ms-per-token",
                str(decode_ms),
            ],
        },
        "tiers": [{"name": "SHORT", "concurrency": in_flight, "max_tokens": 1024}],
        "partitions": [
            {"name": n, "input": str(tmp_path / f"{n}.jsonl"), "tier": "SHORT"} for n in names
        ],
        "output_dir": str(tmp_path / out),
        "batch_size": 8,
    }
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(yaml.safe_dump(config))
    return cfg, tmp_path / out


def job_runs(srv: PrefectServer) -> list[dict[str, Any]]:
    deps = srv.post("/deployments/filter", {"deployments": {"name": {"any_": ["partition-job"]}}})
    return list(
        srv.post("/flow_runs/filter", {"flow_runs": {"deployment_id": {"any_": [deps[0]["id"]]}}})
    )


def test_fan_out_runs_each_partition_once_across_two_workers(
    prefect_server: PrefectServer, deployed: Path, tmp_path: Path
) -> None:
    srv = prefect_server
    fanout_deployment(srv)
    for name in ("fan-a", "fan-b"):
        start_fanout_worker(srv, name, tmp_path)
    parts = {name: write_partition(tmp_path / f"{name}.jsonl", name, 30) for name in "xyz"}
    cfg, shared = fanout_config(
        tmp_path, "xyz", slots=4, decode_ms=5, in_flight=8, out="shared-out"
    )
    run = subprocess.run(
        [sys.executable, "-m", "eagle3_datagen_cli.main", "run", str(cfg), "--fan-out"],
        cwd=REPO,
        env=srv.env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-4000:]

    jobs = job_runs(srv)
    # Each job's run is named by the pipeline flow: deployment, partition, date.
    names = sorted(j["name"] for j in jobs)
    assert [name.split(" ")[:2] for name in names] == [["partition-job:", n] for n in "xyz"]
    assert all(j["state_type"] == "COMPLETED" for j in jobs)
    workers = set()
    for job in jobs:
        logs = srv.post("/logs/filter", {"logs": {"flow_run_id": {"any_": [job["id"]]}}})
        workers |= {
            w for entry in logs for w in ("fan-a", "fan-b") if f"worker {w}" in entry["message"]
        }
    assert workers == {"fan-a", "fan-b"}, "the partitions ran on both workers"

    for name, ids in parts.items():
        table = pq.read_table(sorted((shared / name).glob("part-*.parquet")))
        assert sorted(table.column("id").to_pylist()) == ids  # each record exactly once
    manifest = json.loads((shared / "manifest.json").read_text())
    assert manifest["status"] == "completed"
    assert {n: p["accepted"] for n, p in manifest["partitions"].items()} == {n: 30 for n in "xyz"}
    # The dataset card describes every job's partition, not only the last job's.
    card = (shared / "README.md").read_text()
    assert all(f"config_name: {n}" in card for n in "xyz"), card[:1500]

    # Retrying the fan-out (same flow run, same idempotency keys) runs no partition again.
    [parent] = srv.post(
        "/flow_runs/filter", {"flows": {"name": {"any_": ["eagle3-datagen-fanout"]}}}
    )
    assert re.fullmatch(r"fan-out .+: x\+y\+z \d{4}-\d\d-\d\d \d\d:\d\dZ", parent["name"]), parent
    retry = subprocess.run(
        [sys.executable, "-c", RETRY, parent["id"]],
        cwd=REPO,
        env=srv.env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert retry.returncode == 0, retry.stderr[-3000:]
    again = srv.get(f"/flow_runs/{parent['id']}")
    assert again["state_type"] == "COMPLETED" and again["run_count"] == 2
    assert len(job_runs(srv)) == 3


# What `prefect flow-run retry ID --entrypoint flows/fanout.py:datagen_fanout` does, with the
# `await` that Prefect 3.9.1's CLI misses for async flows (it leaves the run Scheduled).
RETRY = """
import asyncio, sys
from prefect.client.orchestration import get_client
from prefect.flow_engine import run_flow
from prefect.states import Scheduled
from eagle3_datagen_flows.fanout import datagen_fanout

async def main(run_id):
    async with get_client() as client:
        await client.set_flow_run_state(run_id, Scheduled(), force=True)
        flow_run = await client.read_flow_run(run_id)
    params = datagen_fanout.validate_parameters(flow_run.parameters)
    state = await run_flow(datagen_fanout, flow_run=flow_run, parameters=params,
                           return_type="state")
    assert state.is_completed(), state

asyncio.run(main(sys.argv[1]))
"""


def test_ctrl_c_of_a_fan_out_cancels_its_jobs_on_the_workers(
    prefect_server: PrefectServer, tmp_path: Path
) -> None:
    """Ctrl-C of ``run --fan-out``: exit 130, the running job's process stopped by its worker
    (its server with it) and marked Cancelled, the job not yet started Cancelled too."""
    srv = prefect_server
    deps = fanout_deployment(srv)  # the first test's (made again when this test runs alone)
    start_fanout_worker(srv, "stop-a", tmp_path)
    for name in "pq":
        write_partition(tmp_path / f"{name}.jsonl", name, 200)
    # 200 prompts each at 2 at a time, 20 ms a token: the first job still runs at the Ctrl-C
    cfg, _ = fanout_config(tmp_path, "pq", slots=2, decode_ms=20, in_flight=2, out="stop-out")
    log = tmp_path / "cli.log"
    with log.open("wb") as fh:
        proc = subprocess.Popen(
            [sys.executable, "-m", "eagle3_datagen_cli.main", "run", str(cfg), "--fan-out"],
            cwd=REPO,
            env=srv.env,
            stdout=fh,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        _wait_for_jobs(srv, deps[0]["id"], proc, log, lambda s: "RUNNING" in s)
        _wait(
            lambda: bool(list((tmp_path / "stop-out" / ".state" / "servers").glob("*.json"))),
            proc,
            log,
        )
        servers = list((tmp_path / "stop-out" / ".state" / "servers").glob("*.json"))
        server_pid = int(json.loads(servers[0].read_text())["pid"])
        os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C
        assert proc.wait(120) == 130, log.read_text()[-3000:]
        assert (
            log.read_text()
            .strip()
            .splitlines()[-1]
            .startswith(
                "eagle3-datagen: stopped by SIGINT: the run stopped and is marked Cancelled"
            )
        )
        states = _wait_for_jobs(
            srv, deps[0]["id"], None, log, lambda s: set(s) <= {"CANCELLED"}, timeout=120
        )
        assert sorted(states) == ["CANCELLED", "CANCELLED"], states
        assert wait_gone(server_pid, 60), "the running job's server outlived its cancellation"
    finally:
        if proc.poll() is None:
            proc.kill()


def _wait(cond: Any, proc: subprocess.Popen[bytes] | None, log: Path, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert proc is None or proc.poll() is None, log.read_text()[-3000:]
        assert time.monotonic() < deadline, log.read_text()[-3000:]
        time.sleep(0.5)


def _wait_for_jobs(
    srv: PrefectServer,
    deployment_id: str,
    proc: subprocess.Popen[bytes] | None,
    log: Path,
    cond: Any,
    timeout: float = 300,
) -> list[str]:
    """The state types of the jobs of partitions p and q once ``cond`` holds for them."""
    found: list[str] = []

    def ready() -> bool:
        runs = srv.post(
            "/flow_runs/filter", {"flow_runs": {"deployment_id": {"any_": [deployment_id]}}}
        )
        found[:] = [r["state_type"] for r in runs if r["parameters"]["partitions"][0] in "pq"]
        return len(found) == 2 and bool(cond(found))

    _wait(ready, proc, log, timeout)
    return found
