"""Operating the pipeline from Prefect, checked the way a user sees it in the UI.

A real ``prefect server``, the repo's ``deployments/prefect.yaml`` deployed with the CLI, a
process worker on the ``gpu-process`` pool and the emulator: the deployment's schedule and run
form, a demo run's progress, summary and throughput alarm (event, artifact, notification), a run
with a failing server whose Failed task and parent say why, and bad parameters refused.
"""

from __future__ import annotations

import json
import re
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from eagle3_datagen.config import PipelineConfig, load_config
from eagle3_datagen.demo import demo_config
from tests.support import REPO
from tests.support.emulator import EmulatorProcess
from tests.support.prefect import Hook, PrefectServer, Runs, notification_block

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

DEMO = "eagle3-datagen/demo"
PROGRESS_LINE = re.compile(
    r"^demo_short: \d+/64 \(\d+ err\) [\d.]+ req/s avg_comp=\d+tok \d+ tok/s ETA=\S+$"
)


@pytest.fixture(scope="module")
def runs(
    prefect_server: PrefectServer, deployed: Path, tmp_path_factory: pytest.TempPathFactory
) -> Runs:
    """The alert automation, then three runs of the demo deployment, started together."""
    srv = prefect_server
    tmp = tmp_path_factory.mktemp("runs")
    hook = Hook()
    block_id = notification_block(srv, hook.url)
    automation = (REPO / "deployments/automations/throughput-low.yaml").read_text()
    (tmp / "automation.yaml").write_text(
        automation.replace("00000000-0000-0000-0000-000000000000", block_id)
    )
    srv.cli("automation", "create", "--from-file", str(tmp / "automation.yaml"))

    # A slowed emulator (the run outlasts the 10 s progress period) and an alarm set to fire.
    demo = demo_config(tmp / "demo").model_dump(mode="json")
    demo["server"]["extra_args"] += ["--emu-decode-ms-per-token", "10", "--emu-running-slots", "6"]
    demo["throughput"] = {"expected_tok_s": 1e6, "warmup_s": 0, "window_s": 3}
    # A server that answers every /generate with HTTP 500, attached to by URL.
    broken = EmulatorProcess("--emu-fault-500-rate", "1.0").wait_ready()
    failing = demo_config(tmp / "failing").model_dump(mode="json")
    failing["retries"].update(max_attempts=2, backoff_initial_s=0.1, batch_retries=1,
                              batch_retry_delay_s=[0.5])  # fmt: skip
    # Valid JSON for the form, but the partition names a tier that does not exist.
    invalid = demo_config(tmp / "invalid").model_dump(mode="json")
    invalid["partitions"][0]["tier"] = "MEDIUM"

    params = [
        {"config": demo},
        {"config": failing, "server_url": broken.url, "partitions": ["demo_short"]},
        {"config": invalid},
    ]
    try:
        with ThreadPoolExecutor(3) as pool:
            ids = list(pool.map(lambda p: srv.run_deployment(DEMO, p), params))
        for run_id in ids:
            srv.wait_final(run_id)
    finally:
        broken.stop()
    return Runs(ids[0], ids[1], ids[2], tmp / "demo", tmp / "invalid", hook)


def subflow_runs(srv: PrefectServer, parent_id: str) -> dict[str, dict[str, Any]]:
    subs = srv.post(
        "/flow_runs/filter", {"flow_runs": {"parent_flow_run_id": {"any_": [parent_id]}}}
    )
    return {r["name"]: r for r in subs}


def artifacts(srv: PrefectServer, flow_run_ids: list[str], key: str) -> list[dict[str, Any]]:
    return list(
        srv.post("/artifacts/filter", {"artifacts": {"key": {"any_": [key]},
                                                     "flow_run_id": {"any_": flow_run_ids}}})
    )  # fmt: skip


def test_deployments_have_a_paused_schedule_and_a_real_form(
    prefect_server: PrefectServer, deployed: Path
) -> None:
    deps = {d["name"]: d for d in prefect_server.post("/deployments/filter")}
    assert {"kimi-k2.5", "demo"} <= set(deps)
    kimi = deps["kimi-k2.5"]
    assert kimi["work_pool_name"] == "gpu-process"
    assert kimi["entrypoint"] == "flows/pipeline.py:datagen"
    assert kimi["enforce_parameter_schema"] is True
    [schedule] = kimi["schedules"]
    assert schedule["schedule"]["cron"] == "0 2 * * *" and schedule["active"] is False
    # Default parameters are configs/kimi-k2.5.yaml, validated.
    config = PipelineConfig.model_validate(kimi["parameters"]["config"])
    assert config == load_config(REPO / "configs/kimi-k2.5.yaml")
    assert config.throughput.expected_tok_s == 930

    schema = kimi["parameter_openapi_schema"]
    assert schema["required"] == ["config"]
    defs = schema["definitions"]
    props = defs["PipelineConfig"]["properties"]
    for name, item in (("tiers", "Tier"), ("partitions", "Partition")):
        assert props[name]["type"] == "array"  # the UI's "Add item" list
        assert props[name]["items"]["$ref"] == f"#/definitions/{item}"
        assert defs[item]["type"] == "object"
    assert defs["Tier"]["properties"]["concurrency"]["title"] == "Concurrency"
    assert defs["ThroughputAlarm"]["properties"]["expected_tok_s"]["title"]
    assert defs["ServerSpec"]["properties"]["mode"]["enum"] == ["launch", "attach"]  # dropdown
    assert (
        "Attach to this running SGLang server" in schema["properties"]["server_url"]["description"]
    )


def test_bad_parameters_fail_before_anything_starts(
    prefect_server: PrefectServer, runs: Runs
) -> None:
    srv = prefect_server
    # Wrong type: the server refuses to create the run at all.
    bad = demo_config(runs.invalid_dir).model_dump(mode="json")
    bad["tiers"][0]["concurrency"] = "lots"
    out = srv.cli("deployment", "run", DEMO, "--params", json.dumps({"config": bad}), check=False)
    assert "config.tiers[0].concurrency" in out and "is not of type 'integer'" in out
    # Fits the schema but not the config's own checks: Failed before the flow starts.
    run = srv.get(f"/flow_runs/{runs.invalid}")
    assert run["state_type"] == "FAILED"
    assert "names tier 'MEDIUM', which is not in tiers" in run["state"]["message"]
    assert not subflow_runs(srv, runs.invalid)
    assert not runs.invalid_dir.exists()  # no server launched, nothing written


def test_a_demo_run_shows_live_progress_and_a_summary(
    prefect_server: PrefectServer, runs: Runs
) -> None:
    srv = prefect_server
    run = srv.get(f"/flow_runs/{runs.demo}")
    assert run["state_type"] == "COMPLETED", run["state"]["message"]
    subs = subflow_runs(srv, runs.demo)
    assert set(subs) == {"partition-demo_short", "partition-demo_long"}

    # One progress artifact per partition, at 100% with the progress line as its description.
    for name, counts in (("demo_short", "64/64"), ("demo_long", "24/24")):
        sub_id = subs[f"partition-{name}"]["id"]
        [progress] = artifacts(srv, [sub_id], f"progress-{name.replace('_', '-')}")
        assert progress["type"] == "progress" and progress["data"] == 100
        assert progress["description"].startswith(f"{name}: {counts} (0 err)")

    # The progress log line, every 10 s while running and once at the end.
    logs = srv.post(
        "/logs/filter", {"logs": {"flow_run_id": {"any_": [subs["partition-demo_short"]["id"]]}}}
    )
    lines = [entry["message"] for entry in logs if PROGRESS_LINE.match(entry["message"])]
    assert len(lines) >= 2, [entry["message"] for entry in logs]

    [summary] = artifacts(srv, [runs.demo], "datagen-summary")
    assert summary["type"] == "table"
    rows = {row["partition"]: row for row in json.loads(summary["data"])}
    short, long_ = rows["demo_short"], rows["demo_long"]
    assert (short["status"], short["accepted"], short["rejected"]) == ("completed", 60, 4)
    assert short["rejected_by_reason"] == "bad_input=3, duplicate_id=1"
    assert (long_["accepted"], long_["rejected"]) == (24, 0)
    for row in (short, long_):
        assert row["truncation_rate"].endswith("%") and row["tok_per_s"] > 0
        assert re.fullmatch(r"[\d.]+s|\d+m\d\ds", row["wall_time"])
    assert summary["description"].startswith("2 partitions, 84 records accepted")


def test_low_throughput_raises_one_alarm_per_dip(prefect_server: PrefectServer, runs: Runs) -> None:
    srv = prefect_server
    resource = f"prefect.flow-run.{runs.demo}"
    page = srv.post("/events/filter", {"filter": {
        "event": {"prefix": ["eagle3-datagen.throughput."]},
        "resource": {"id": [resource]},
    }, "limit": 50})  # fmt: skip
    events = page["events"]
    assert [e["event"] for e in events] == ["eagle3-datagen.throughput.low"]  # once, not per sample
    payload = events[0]["payload"]
    assert payload["expected_tok_s"] == 1e6 and payload["rate_tok_s"] < 5e5
    assert payload["shortfall_pct"] > 50 and payload["window_s"] == 3

    [alarm] = artifacts(srv, [runs.demo], "throughput-alarm")
    assert alarm["type"] == "markdown" and "below expected" in alarm["data"]
    # The automation from deployments/automations turned the event into a notification.
    run_name = srv.get(f"/flow_runs/{runs.demo}")["name"]
    deadline = time.monotonic() + 60
    while not runs.hook.received and time.monotonic() < deadline:
        time.sleep(1)
    assert any(f"throughput low in {run_name}" in body for body in runs.hook.received)


def test_a_failing_batch_and_its_partition_say_why(
    prefect_server: PrefectServer, runs: Runs
) -> None:
    srv = prefect_server
    parent = srv.get(f"/flow_runs/{runs.failing}")
    assert parent["state_type"] == "FAILED"
    assert "1 of 1 partitions failed (demo_short)" in parent["state"]["message"]
    subs = subflow_runs(srv, runs.failing)
    sub = subs["partition-demo_short"]
    assert sub["state_type"] == "FAILED"
    assert "batches of partition demo_short failed" in sub["state"]["message"]

    query = {"task_runs": {"state": {"type": {"any_": ["FAILED"]}}},
             "flow_runs": {"id": {"any_": [sub["id"]]}}}  # fmt: skip
    failed = srv.post("/task_runs/filter", query)
    batches = [t for t in failed if t["name"].startswith("generate[")]
    assert batches, failed
    for task in batches:
        message = task["state"]["message"]
        assert f"{task['name']}: line " in message  # e.g. generate[demo_short/0002]: line 46: ...
        assert "request failed after 2 attempts: HTTP 500" in message
        assert task["run_count"] == 2  # Prefect retried the batch once (batch_retries: 1)

    [summary] = artifacts(srv, [runs.failing], "datagen-summary")
    [row] = json.loads(summary["data"])
    assert row["status"] == "failed" and "HTTP 500" in row["error"]
