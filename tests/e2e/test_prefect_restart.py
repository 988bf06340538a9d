"""The Prefect server restarts under a deployment run: nothing lost, nothing twice.

A real ``prefect server`` on PostgreSQL (as in production), a process work pool and worker, a
run of the ``demo`` deployment slowed to last about a minute. Mid-run the server is stopped
(SIGTERM by pid) for ``OUTAGE_S`` seconds, then started again on the same port and database.
The run either carries on to Completed, or ends in a state whose rerun (same output directory)
completes the dataset. Either way the Parquet holds every input id once, each record's
``output_ids`` equal to what the emulator's ledger says it sent.
docs/operations.md reports what this test saw.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from eagle3_datagen.demo import demo_config
from tests.support import wait_until
from tests.support.emulator import read_ledger
from tests.support.postgres import missing_reason, running_postgres
from tests.support.prefect import PrefectServer, running_prefect_server
from tests.support.prompts import prompt_ids, write_prompts

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

OUTAGE_S = 30
PARTS = {"restart_a": (56, 0, "SHORT"), "restart_b": (24, 1000, "LONG")}  # n, first id, tier
# In the flow run's environment (replacing the deployment's, which asks for 8 retries): a client
# retry window (2+4+8 s) shorter than the outage, so calls made during it give up, as any call
# does in an outage longer than its window; and the client's retry lines at DEBUG, to see them.
CLIENT_ENV = {
    "PREFECT_CLIENT_MAX_RETRIES": "3",
    "PREFECT_CLIENT_RETRY_EXTRA_CODES": "500",
    "PREFECT_LOGGING_LOGGERS_PREFECT_CLIENT_LEVEL": "DEBUG",
    "PREFECT_LOGGING_EXTRA_LOGGERS": "eagle3_datagen",
    "TRANSFORMERS_VERBOSITY": "error",
}
PROGRESS = re.compile(r"^(restart_[ab]): (\d+)/(\d+) ")


@pytest.fixture(scope="module")
def prefect_on_postgres() -> Iterator[PrefectServer]:
    reason = missing_reason()
    if reason:
        pytest.skip(reason)
    with running_postgres() as pg, running_prefect_server(database_url=pg.url) as srv:
        yield srv


def generated(ledger: Path) -> int:
    return sum(1 for e in read_ledger(ledger) if ":" in e["rid"])


def state_history(srv: PrefectServer, flow_run_id: str) -> list[str]:
    states = srv.get(f"/flow_run_states/?flow_run_id={flow_run_id}")
    return [s["type"] for s in sorted(states, key=lambda s: s["timestamp"])]


def run_logs(
    srv: PrefectServer, flow_run_ids: list[str], after: datetime
) -> list[tuple[datetime, str]]:
    """Every log line of the runs since ``after``, page by page (the API caps a page at 200)."""
    found: list[tuple[datetime, str]] = []
    while True:
        page = srv.post(
            "/logs/filter",
            {
                "logs": {
                    "flow_run_id": {"any_": flow_run_ids},
                    "timestamp": {"after_": after.isoformat()},
                },
                "sort": "TIMESTAMP_ASC",
                "limit": 200,
                "offset": len(found),
            },
        )
        found += [(datetime.fromisoformat(e["timestamp"]), e["message"]) for e in page]
        if len(page) < 200:
            return found


def test_prefect_server_restart_mid_run_loses_nothing_and_duplicates_nothing(
    prefect_on_postgres: PrefectServer, tmp_path: Path
) -> None:
    srv = prefect_on_postgres
    srv.env.update(CLIENT_ENV)
    srv.cli("work-pool", "create", "gpu-process", "--type", "process")
    srv.cli("--no-prompt", "deploy", "--name", "demo", "--prefect-file", "deployments/prefect.yaml")
    worker_log = tmp_path / "worker.log"
    srv.start("worker", "start", "--pool", "gpu-process", "--name", "restart-node", log=worker_log)

    out = tmp_path / "out"
    config: dict[str, Any] = demo_config(out).model_dump(mode="json")
    config["partitions"] = [
        {
            "name": name,
            "input": str(write_prompts(tmp_path / f"{name}.jsonl", n, first=first)),
            "tier": tier,
        }
        for name, (n, first, tier) in PARTS.items()
    ]
    config["batch_size"] = 8
    # ~80 requests of ~100 tokens at 80 ms/token, 4 at a time: about 160 s of generation, so a
    # partition outlasts the outage, the restart (37 s seen on a loaded 2-core machine) and a
    # progress period after it (the assertion below).
    config["server"]["extra_args"] += [
        "--emu-decode-ms-per-token",
        "80",
        "--emu-running-slots",
        "4",
        "--emu-mean-output-tokens",
        "100",
        "--emu-output-sigma",
        "0.3",
    ]
    ledger = out / "emulator-ledger.jsonl"

    run_id = srv.run_deployment("eagle3-datagen/demo", {"config": config}, env=CLIENT_ENV)
    wait_until(lambda: generated(ledger) >= 8, timeout_s=180, interval_s=0.5)
    at_stop = generated(ledger)
    srv.stop_server()
    time.sleep(OUTAGE_S)
    during = generated(ledger) - at_stop
    restart_s = srv.start_server()
    back = datetime.now(UTC)
    first = srv.wait_final(run_id, timeout=300)
    history = state_history(srv, run_id)
    retries = [
        line
        for line in worker_log.read_text().splitlines()
        if "Another attempt will be made" in line
    ]
    print(
        f"first run: {first['state_type']} {first['state']['message']!r}, states {history}; "
        f"{during} requests answered during the {OUTAGE_S} s outage, server back "
        f"{restart_s:.1f} s after restart; {len(retries)} client retries logged"
    )
    assert during > 0, "generation went on while the Prefect server was down"

    if first["state_type"] != "COMPLETED":
        # The documented recovery: run the same deployment again into the same directory.
        again = srv.run_deployment("eagle3-datagen/demo", {"config": config}, env=CLIENT_ENV)
        rerun = srv.wait_final(again)
        assert rerun["state_type"] == "COMPLETED", rerun["state"]
    else:
        # Each partition's progress reporter outlived the outage: progress lines after it.
        subs = srv.post(
            "/flow_runs/filter", {"flow_runs": {"parent_flow_run_id": {"any_": [run_id]}}}
        )
        logs = run_logs(srv, [s["id"] for s in subs], after=back)
        matches = [m for ts, msg in logs if ts > back and (m := PROGRESS.match(msg))]
        after = {m.group(1) for m in matches if m.group(2) != m.group(3)}  # not the final line
        late = back + timedelta(seconds=12)
        busy = {
            s["name"].split(" ")[0].removeprefix("partition-")
            for s in subs
            if datetime.fromisoformat(s["end_time"]) > late
        }
        assert busy, "no partition outlasted the restart by a progress period; slow the run"
        assert busy <= after, f"no progress lines after the restart from {busy - after}"

    ledger_out = {e["rid"]: e["output_ids"] for e in read_ledger(ledger)}
    for name, (n, first_id, _) in PARTS.items():
        table = pq.read_table(sorted((out / name).glob("part-*.parquet"))).to_pylist()
        assert sorted(r["id"] for r in table) == prompt_ids(n, first_id), name  # each id once
        for record in table:
            assert record["output_ids"] == ledger_out[record["rid"]], record["id"]
