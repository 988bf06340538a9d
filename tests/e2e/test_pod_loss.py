"""A partition job's pod lost mid-partition, twice: the dataset ends complete, nothing redone.

A process work pool stands in for the Kubernetes pool: its worker runs each flow run with the
command and the environment that prefect-kubernetes renders into the partition job's pod
(``tests/fixtures/kubernetes/partition-job-k8s.json``): ``prefect flow-run execute`` with
``PREFECT_FLOW_RUN_EXECUTE_SIGTERM_BEHAVIOR=reschedule`` (``backoffLimit: 0``).

1. Eviction or preemption: the kubelet sends SIGTERM to the pod's main process, the
   ``flow-run execute`` supervisor. The run goes back to Scheduled and the worker starts the
   same flow run again (a new pod), which resumes from the journal.
2. The node is lost: the whole process tree is SIGKILLed. The run ends Crashed, and a new run
   of the deployment with the same parameters completes the partition.

Every input id is in the Parquet once, each record's ``output_ids`` are what the emulator's
ledger says it sent, and no line of a batch committed before a loss is requested again.
"""

from __future__ import annotations

import json
import os
import re
import signal
import time
from pathlib import Path
from typing import Any

import httpx
import pyarrow.parquet as pq
import pytest

from eagle3_datagen.demo import demo_config
from eagle3_datagen.write.shards import PartitionOutput
from tests.support import REPO, wait_until
from tests.support.emulator import read_ledger
from tests.support.prefect import PrefectServer
from tests.support.prompts import prompt_ids, write_prompts

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]

POOL = "pods-standin"
PART = "podloss"
N = 64
POD = REPO / "tests" / "fixtures" / "kubernetes" / "partition-job-k8s.json"


def pod_command_and_env() -> tuple[str, dict[str, str]]:
    """What the Kubernetes worker puts in the partition job's container, less the run's ids and
    the API address (the process worker sets those itself)."""
    (container,) = json.loads(POD.read_text())["spec"]["template"]["spec"]["containers"]
    env = {
        v["name"]: v["value"]
        for v in container["env"]
        if not v["name"].startswith("PREFECT__") and v["name"] != "PREFECT_API_URL"
    }
    return " ".join(container["args"]), env


def committed_lines(out: Path) -> set[int]:
    return {
        line
        for b in PartitionOutput(out, PART).batch_summaries()
        for line in range(b.first_line, b.first_line + b.lines)
    }


def requested_lines(ledger: Path) -> list[int]:
    """The input line of every generation request the emulators answered (rid
    ``run:partition:line[suffix]:attempt``)."""
    return [
        int(re.match(r"\d+", e["rid"].split(":")[2]).group())  # type: ignore[union-attr]
        for e in read_ledger(ledger)
        if f":{PART}:" in e["rid"]
    ]


def descendants(pid: int) -> list[int]:
    """Processes under ``pid`` (children first), from /proc."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        ppid = int(text[text.rfind(")") + 2 :].split()[1])
        children.setdefault(ppid, []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def supervisor(worker_pid: int) -> int:
    """The worker's ``prefect flow-run execute`` child: the pod's main process."""
    for pid in descendants(worker_pid):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"flow-run" in cmdline and b"execute" in cmdline:
            return pid
    raise LookupError("no flow-run execute process under the worker")


def states(srv: PrefectServer, run_id: str) -> list[str]:
    found = srv.get(f"/flow_run_states/?flow_run_id={run_id}")
    return [s["name"] for s in sorted(found, key=lambda s: s["timestamp"])]


def test_lost_pods_resume_exactly(prefect_server: PrefectServer, tmp_path: Path) -> None:
    srv = prefect_server
    srv.cli("work-pool", "create", POOL, "--type", "process")
    srv.cli(
        "--no-prompt",
        "deploy",
        "--name",
        "partition-job",
        "--pool",
        POOL,
        "--prefect-file",
        "deployments/prefect.yaml",
    )
    worker = srv.start(
        "worker",
        "start",
        "--pool",
        POOL,
        "--name",
        "pod",
        "--limit",
        "1",
        log=tmp_path / "worker.log",
    )
    command, env = pod_command_and_env()
    assert env["PREFECT_FLOW_RUN_EXECUTE_SIGTERM_BEHAVIOR"] == "reschedule"

    out = tmp_path / "out"
    config: dict[str, Any] = demo_config(out).model_dump(mode="json")
    config["partitions"] = [
        {"name": PART, "input": str(write_prompts(tmp_path / "in.jsonl", N)), "tier": "SHORT"}
    ]
    config["batch_size"] = 8
    config["server"]["port"] = 0
    # 64 requests of ~60 tokens at 20 ms/token, 4 at a time: ~20 s of generation per attempt.
    config["server"]["extra_args"] += [
        "--emu-decode-ms-per-token",
        "20",
        "--emu-running-slots",
        "4",
        "--emu-mean-output-tokens",
        "60",
        "--emu-output-sigma",
        "0.3",
    ]
    ledger = out / "emulator-ledger.jsonl"

    deployment = srv.get("/deployments/name/eagle3-datagen/partition-job")["id"]

    def start_run() -> str:
        """What ``prefect deployment run ... --job-variable`` sends, straight to the API (503,
        a busy SQLite server, is retried as Prefect's client would)."""
        body = {
            "parameters": {"config": config, "partitions": [PART]},
            "job_variables": {"env": env, "command": command},
        }
        for _ in range(10):
            r = httpx.post(
                f"{srv.api}/deployments/{deployment}/create_flow_run", json=body, timeout=60
            )
            if r.status_code != 503:
                break
            time.sleep(3)
        r.raise_for_status()
        return str(r.json()["id"])

    t0 = time.monotonic()

    def mark(what: str) -> None:
        print(f"{time.monotonic() - t0:6.1f} s  {what}", flush=True)

    run_id = start_run()
    mark("run started")
    # 1. Eviction: SIGTERM to the supervisor once two batches are committed.
    wait_until(lambda: len(committed_lines(out)) >= 16, timeout_s=240, interval_s=0.2)
    before_term = committed_lines(out)
    first = supervisor(worker.pid)
    os.kill(first, signal.SIGTERM)
    mark(f"SIGTERM after {len(before_term)} lines")
    wait_until(lambda: "AwaitingRetry" in states(srv, run_id), timeout_s=60, interval_s=0.5)
    lock = out / "_locks" / f"{PART}.lock"
    wait_until(lambda: not Path(f"/proc/{first}").exists(), timeout_s=90, interval_s=0.5)
    # Released on the way out: a new pod on another host need not wait out the lease.
    assert not lock.exists(), lock.read_text()

    mark("rescheduled, supervisor gone, lock released")
    # The worker starts the same flow run again; it resumes and commits more.
    wait_until(lambda: len(committed_lines(out) - before_term) >= 8, timeout_s=240, interval_s=0.2)
    # 2. The node is lost: every process of the "pod" at once.
    before_kill = committed_lines(out)
    second = supervisor(worker.pid)
    assert second != first
    tree = [second, *descendants(second)]
    for pid in tree:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    mark(f"SIGKILL after {len(before_kill)} lines")
    crashed = srv.wait_final(run_id, timeout=120)
    mark("crashed")
    assert crashed["state_type"] == "CRASHED", crashed["state"]
    history = states(srv, run_id)
    assert history.count("Running") >= 2, history  # the same run, started twice
    assert len(before_kill) < N, "the run finished before it could be killed; slow it down"

    again = srv.wait_final(start_run(), timeout=300)
    mark("new run final")
    assert again["state_type"] == "COMPLETED", again["state"]

    table = pq.read_table(sorted((out / PART).glob("part-*.parquet"))).to_pylist()
    assert sorted(r["id"] for r in table) == prompt_ids(N)  # every id once
    sent = {e["rid"]: e["output_ids"] for e in read_ledger(ledger)}
    for record in table:
        assert record["output_ids"] == sent[record["rid"]], record["id"]
    requests = requested_lines(ledger)
    twice = sorted({line for line in before_kill if requests.count(line) > 1})
    assert not twice, f"lines of committed batches requested again: {twice}"
    print(
        f"SIGTERM after {len(before_term)} lines, SIGKILL after {len(before_kill)}; "
        f"{len(requests)} requests for {N} lines; states {history}"
    )
