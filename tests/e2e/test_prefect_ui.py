"""Operating the pipeline from Prefect, checked the way a user sees it in the UI.

A real ``prefect server``, the repo's ``deployments/prefect.yaml`` deployed with the CLI, a
process worker on the ``gpu-process`` pool and the emulator: the deployment's schedule and run
form, a demo run's progress, summary and throughput alarm (event, artifact, notification), a run
with a failing server whose Failed task and parent say why, and bad parameters refused.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from eagle3_datagen.config import PipelineConfig, load_config
from eagle3_datagen.demo import demo_config
from eagle3_datagen.report.ui import EMULATED
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
    notification_block(srv, hook.url)
    # The shipped file has no block id, so Prefect refuses it as it is ...
    refused = srv.cli(
        "automation", "create", "--from-file", "flows/automations/throughput-low.yaml", check=False
    )
    assert "block_document_id" in refused, refused
    # The only automation so far is the eval deployment's chain (deployments/prefect.yaml),
    # created disabled: nothing fires after a run until a user turns it on.
    (chain,) = srv.post("/automations/filter")
    assert chain["name"] == "kimi-k2.5-eval__automation_1", chain
    assert chain["enabled"] is False, chain
    assert chain["trigger"]["match_related"]["prefect.resource.name"] == "kimi-k2.5", chain
    # ... and `eagle3-datagen alarm install` creates it with the named block, as README says.
    out = datagen_cli(srv, "alarm", "install", "--block", "eagle3-alerts")
    assert "created: notifies through custom-webhook/eagle3-alerts" in out, out

    # A slowed emulator (the run outlasts the 10 s progress period) and an alarm set to fire.
    demo = demo_config(tmp / "demo").model_dump(mode="json")
    demo["server"]["extra_args"] += ["--emu-decode-ms-per-token", "10", "--emu-running-slots", "6"]
    demo["throughput"] = {"expected_tok_s": 1e6, "warmup_s": 0, "window_s": 3}
    # A server that answers every /generate with HTTP 500, attached to by URL.
    broken = EmulatorProcess("--emu-fault-500-rate", "1.0").wait_ready()
    failing = demo_config(tmp / "failing").model_dump(mode="json")
    failing["retries"].update(
        max_attempts=2, backoff_initial_s=0.1, batch_retries=1, batch_retry_delay_s=[0.5]
    )
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


def datagen_cli(srv: PrefectServer, *args: str) -> str:
    """``eagle3-datagen ARGS`` against the test's Prefect server."""
    proc = subprocess.run(
        [sys.executable, "-m", "eagle3_datagen_cli.main", *args],
        cwd=REPO,
        env=srv.env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def subflow_runs(srv: PrefectServer, parent_id: str) -> dict[str, dict[str, Any]]:
    subs = srv.post(
        "/flow_runs/filter", {"flow_runs": {"parent_flow_run_id": {"any_": [parent_id]}}}
    )
    # Subflows are named ``partition-<name> <date>``: keyed here by the part before the date.
    return {r["name"].split(" ")[0]: r for r in subs}


def artifacts(srv: PrefectServer, flow_run_ids: list[str], key: str) -> list[dict[str, Any]]:
    return list(
        srv.post(
            "/artifacts/filter",
            {"artifacts": {"key": {"any_": [key]}, "flow_run_id": {"any_": flow_run_ids}}},
        )
    )


def test_deployments_have_a_paused_schedule_and_a_real_form(
    prefect_server: PrefectServer, deployed: Path
) -> None:
    deps = {d["name"]: d for d in prefect_server.post("/deployments/filter")}
    # README's commands, run as written on a fresh server, make the deployments it names.
    assert set(deps) == {"kimi-k2.5", "demo", "partition-job", "kimi-k2.5-fanout", "kimi-k2.5-eval"}
    assert "makes five deployments" in " ".join((REPO / "README.md").read_text().split())
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
    # The run-level parameters come first in the form, the long config last.
    order = sorted(schema["properties"], key=lambda k: schema["properties"][k]["position"])
    assert order == ["partitions", "server_url", "overwrite", "config"]
    defs = schema["definitions"]
    props = defs["PipelineConfig"]["properties"]
    for name, item in (("tiers", "Tier"), ("partitions", "Partition")):
        assert props[name]["type"] == "array"  # the UI's "Add item" list
        assert props[name]["items"]["$ref"] == f"#/definitions/{item}"
        assert defs[item]["type"] == "object"
    assert defs["Tier"]["properties"]["concurrency"]["title"] == "Concurrency"
    assert defs["ThroughputAlarm"]["properties"]["expected_tok_s"]["title"]
    assert defs["ServerSpec"]["properties"]["mode"]["enum"] == ["launch", "attach"]  # dropdown
    # A config key's docstring is its help text in the form.
    limits = defs["ServerLimits"]["properties"]
    assert limits["request_timeout_s"]["description"].startswith("Per-request timeout")
    assert (
        "Attach to this running SGLang server" in schema["properties"]["server_url"]["description"]
    )


def test_bad_parameters_fail_before_anything_starts(
    prefect_server: PrefectServer, runs: Runs
) -> None:
    srv = prefect_server
    # Wrong type: the server refuses to create the run at all.
    bad = demo_config(runs.invalid_dir).model_dump(mode="json")
    bad["tiers"][0]["max_tokens"] = "lots"
    out = srv.cli("deployment", "run", DEMO, "--params", json.dumps({"config": bad}), check=False)
    assert "config.tiers[0].max_tokens" in out and "is not of type 'integer'" in out
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
    # A name that says what ran: the deployment, the partitions, when.
    assert re.fullmatch(
        r"demo: demo_short\+demo_long\+demo_images \d{4}-\d\d-\d\d \d\d:\d\dZ", run["name"]
    )
    subs = subflow_runs(srv, runs.demo)
    assert set(subs) == {"partition-demo_short", "partition-demo_long", "partition-demo_images"}
    assert all(re.fullmatch(r"\S+ \d{4}-\d\d-\d\d \d\d:\d\dZ", s["name"]) for s in subs.values())
    # The parent is tagged with its partitions too.
    assert {"partition:demo_short", "partition:demo_long"} <= set(run["tags"]), run["tags"]
    # Subflows and their batch tasks carry partition, tier and the deployment's tags.
    for name, tier in (("demo_short", "SHORT"), ("demo_long", "LONG")):
        sub = subs[f"partition-{name}"]
        want = {f"partition:{name}", f"tier:{tier}", "eagle3-datagen", "demo"}
        assert want <= set(sub["tags"]), sub["tags"]
        tasks = srv.post("/task_runs/filter", {"flow_runs": {"id": {"any_": [sub["id"]]}}})
        batches = [t for t in tasks if t["name"].startswith("generate[")]
        assert batches and all(want <= set(t["tags"]) for t in batches)
    # Side by side: the parent called the two text partitions' subflows together, not one
    # after the other. Each subflow run is created when the parent calls it, so "together"
    # means both were created before either ended. Their start times are not compared: a
    # subflow's start waits on its own set-up and, under load, on Prefect's SQLite "database is
    # locked" back-off (13 s once on a loaded machine, longer than the other subflow's 7 s
    # run), so no wall-clock bound on starts tells the two apart.
    text = [sub for name, sub in subs.items() if name != "partition-demo_images"]
    created = [datetime.fromisoformat(sub["created"]) for sub in text]
    ended = [datetime.fromisoformat(sub["end_time"]) for sub in text]
    print(f"subflows created {created}, ended {ended}")
    assert max(created) < min(ended), (created, ended)

    # One progress artifact per partition, at 100% with the progress line as its description.
    line_tok_s = {}
    for name, counts in (("demo_short", "64/64"), ("demo_long", "24/24")):
        sub_id = subs[f"partition-{name}"]["id"]
        [progress] = artifacts(srv, [sub_id], f"progress-{name.replace('_', '-')}")
        assert progress["type"] == "progress" and progress["data"] == 100
        assert progress["description"].startswith(f"{name}: {counts} (0 err)")
        line_tok_s[name] = int(re.findall(r"(\d+) tok/s", progress["description"])[0])
    # And one on the parent with every partition in a table.
    [overall] = artifacts(srv, [runs.demo], "datagen-progress")
    assert overall["type"] == "progress" and overall["data"] == 100
    assert "| demo_short | completed | 64/64 | 100% |" in overall["description"]
    assert "| demo_long | completed | 24/24 | 100% |" in overall["description"]
    # The data picture of each partition, and the dataset card in the output directory.
    [picture] = artifacts(srv, [runs.demo], "data-demo-short")
    assert picture["type"] == "markdown" and "**output length (tokens)**" in picture["data"]
    assert "reject rate 6.2%: bad_input 3, duplicate_id 1" in picture["data"]
    card = (runs.demo_dir / "README.md").read_text()
    assert "config_name: demo_short" in card and "## How to load" in card

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
    assert (short["input_lines"], long_["input_lines"]) == (64, 24)
    assert short["on_disk"] == "64 of 64 lines: 60 accepted, 4 rejected"
    for name, row in (("demo_short", short), ("demo_long", long_)):
        assert row["truncation_rate"].endswith("%") and row["tok_per_s"] > 0
        assert row["tok_per_s"] == line_tok_s[name]  # one tok/s: summary = progress line
        assert re.fullmatch(r"[\d.]+s|\d+m\d\ds", row["wall_time"])
    images = rows["demo_images"]  # the image partition: 2 planted bad images
    assert (images["accepted"], images["rejected"]) == (6, 2)
    assert summary["description"].startswith(f"{EMULATED}; 3 partitions, 90 records accepted")


def test_low_throughput_raises_one_alarm_per_dip(prefect_server: PrefectServer, runs: Runs) -> None:
    srv = prefect_server
    resource = f"prefect.flow-run.{runs.demo}"
    page = srv.post(
        "/events/filter",
        {
            "filter": {
                "event": {"prefix": ["eagle3-datagen.throughput."]},
                "resource": {"id": [resource]},
            },
            "limit": 50,
        },
    )
    events = page["events"]
    assert [e["event"] for e in events] == ["eagle3-datagen.throughput.low"]  # once, not per sample
    payload = events[0]["payload"]
    assert payload["expected_tok_s"] == 1e6 and payload["rate_tok_s"] < 5e5
    assert payload["shortfall_pct"] > 50 and payload["window_s"] == 3

    [alarm] = artifacts(srv, [runs.demo], "throughput-alarm")
    assert alarm["type"] == "markdown" and "below expected" in alarm["data"]
    # The automation from flows/automations turned the event into a notification.
    run_name = srv.get(f"/flow_runs/{runs.demo}")["name"]
    deadline = time.monotonic() + 60

    def alarmed() -> bool:  # the run-failed automation notifies through the same block
        return any(f"throughput low in {run_name}" in body for body in runs.hook.received)

    while not alarmed() and time.monotonic() < deadline:
        time.sleep(1)
    assert alarmed(), runs.hook.received


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

    query = {
        "task_runs": {"state": {"type": {"any_": ["FAILED"]}}},
        "flow_runs": {"id": {"any_": [sub["id"]]}},
    }
    failed = srv.post("/task_runs/filter", query)
    batches = [t for t in failed if t["name"].startswith("generate[")]
    assert batches, failed
    for task in batches:
        message = task["state"]["message"]
        assert f"{task['name']}: line " in message  # e.g. generate[demo_short/0002]: line 46: ...
        assert "request failed after 2 attempts: HTTP 500" in message
        assert task["run_count"] == 2  # Prefect retried the batch once (batch_retries: 1)

    # Progress counts each line once although every batch ran twice.
    [progress] = artifacts(srv, [sub["id"]], "progress-demo-short")
    done, total = map(int, re.findall(r"demo_short: (\d+)/(\d+) ", progress["description"])[0])
    assert total == 64 and done <= 64 and progress["data"] <= 100, progress["description"]

    # The failed-batches table: batch, lines, cause, attempts.
    [table] = artifacts(srv, [sub["id"]], "failed-batches-demo-short")
    rows = json.loads(table["data"])
    assert [r["batch"] for r in rows] == [f"demo_short/{i:04d}" for i in range(4)]
    assert [(r["first_line"], r["last_line"]) for r in rows] == [
        (1, 16),
        (17, 32),
        (33, 48),
        (49, 64),
    ]
    for r in rows:
        assert r["attempts"] == 2 and "request failed after 2 attempts: HTTP 500" in r["cause"]

    # The summary: this run's numbers, the partition's size, and the table one click away.
    [summary] = artifacts(srv, [runs.failing], "datagen-summary")
    [row] = json.loads(summary["data"])
    assert row["status"] == "failed" and "HTTP 500" in row["error"]
    assert (row["input_lines"], row["accepted"], row["output_tokens"]) == (64, 0, 0)
    assert row["error"].startswith(
        f"[4 failed batches]({srv.api.removesuffix('/api')}/artifacts/artifact/{table['id']}): "
    )

    # The same from the command line.
    out = datagen_cli(srv, "failures", runs.failing)
    assert "4 failed batches:" in out
    assert re.search(
        r"demo_short/0002\t33-48\t2\tline \d+: request failed after 2 attempts: "
        r"HTTP 500",
        out,
    ), out
