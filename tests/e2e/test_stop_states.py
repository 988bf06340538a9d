"""Ctrl-C of the command line (launch and attach mode) and Cancel from the UI say the same true
thing: the launched server stopped once (never taken for lost, never relaunched), the flow run,
its subflows and every batch task in flight Cancelled (none Crashed), the partitions that had
finished Completed in every artifact, progress never backwards, and a few quiet lines."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from eagle3_datagen.demo import demo_config
from eagle3_datagen.processes import pid_alive
from eagle3_datagen.report.ui import RUN_PROGRESS_KEY, SUMMARY_KEY
from tests.support import REPO
from tests.support.emulator import EmulatorProcess
from tests.support.prefect import PrefectServer

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

# Short-tier answers (~20 tokens) come at once; long-tier ones (~3000 tokens at 5 ms each)
# take 15 s and more: demo_short and demo_images finish while demo_long still generates. A KV
# pool that holds every request's reservation at once: with the default (4 x the context
# length) demo_long's requests, if admitted first, take the room demo_short's need until they
# finish (sglang/budget.py), and the stop would land on a run where nothing had finished.
SLOW_LONG = [
    "--emu-decode-ms-per-token",
    "5",
    "--emu-output-by-max-new",
    "16384:3000,10240:20",
    "--emu-max-total-tokens",
    "4000000",
]
NOT_SAID = ("ERROR", "Traceback", "Unclosed client session", "Crash detected", "server lost")


def _config(tmp_path: Path, *, attach: bool = False) -> tuple[Path, Path]:
    # Runs are named after their output directory, and _parent finds this test's run by that
    # name on a server the session's other tests share: one name per test.
    out = tmp_path / f"{tmp_path.name}-out"
    config = demo_config(out).model_dump(mode="json")
    if not attach:
        config["server"]["extra_args"] += SLOW_LONG
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(config))
    return path, out


def _start(cfg: Path, env: dict[str, str], log: Path, *args: str) -> subprocess.Popen[bytes]:
    """The command as a terminal starts it: its own process group (Ctrl-C goes to the group)."""
    exe = Path(sys.executable).with_name("eagle3-datagen")
    with log.open("wb") as fh:
        return subprocess.Popen(
            [str(exe), "run", str(cfg), *args],
            cwd=REPO,
            env=env,
            stdout=fh,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def _subflows(srv: PrefectServer, parent_id: str) -> dict[str, dict[str, Any]]:
    subs = srv.post(
        "/flow_runs/filter", {"flow_runs": {"parent_flow_run_id": {"any_": [parent_id]}}}
    )
    return {r["name"].split(" ")[0].removeprefix("partition-"): r for r in subs}


def _parent(srv: PrefectServer, out: Path) -> dict[str, Any] | None:
    """The newest flow run writing into ``out`` (named after its output directory)."""
    query = {"flow_runs": {"name": {"like_": f"{out.name}: "}}, "sort": "START_TIME_DESC"}
    for run in srv.post("/flow_runs/filter", {**query, "limit": 1}):
        return dict(run)
    return None


def _one_finished(srv: PrefectServer, parent_id: str) -> bool:
    """demo_short and demo_images finished while demo_long still generates: its subflow and
    each of its 2 batch tasks Running (a stop landing while Prefect's engine still starts a
    task is another case: the task is Crashed by the engine before its code runs, and the
    flow's clean-up sets it Cancelled; docs/operations.md)."""
    subs = _subflows(srv, parent_id)
    states = {name: sub["state_type"] for name, sub in subs.items()}
    if states != {"demo_short": "COMPLETED", "demo_images": "COMPLETED", "demo_long": "RUNNING"}:
        return False
    query = {"flow_runs": {"id": {"any_": [subs["demo_long"]["id"]]}}}
    batches = [t["state_type"] for t in srv.post("/task_runs/filter", query)]
    return batches == ["RUNNING", "RUNNING"]


def _wait(what: Callable[[], Any], why: Callable[[], Any], timeout_s: float = 300) -> Any:
    deadline = time.monotonic() + timeout_s
    while not (got := what()):
        assert time.monotonic() < deadline, why()
        time.sleep(0.3)
    return got


def _progress_artifact(srv: PrefectServer, run_id: str) -> dict[str, Any]:
    [art] = srv.post(
        "/artifacts/filter",
        {"artifacts": {"key": {"any_": [RUN_PROGRESS_KEY]}, "flow_run_id": {"any_": [run_id]}}},
    )
    return dict(art)


def _progress(srv: PrefectServer, run_id: str) -> float:
    return float(_progress_artifact(srv, run_id)["data"])


def _rows_say(srv: PrefectServer, run_id: str, said: dict[str, str]) -> bool:
    """The parent's live progress table has each partition's row in the state ``said``."""
    table = _progress_artifact(srv, run_id)["description"] or ""
    rows = {line.split("|")[1].strip(): line for line in table.splitlines() if line.count("|") > 2}
    return all(f" {state} " in rows.get(name, "") for name, state in said.items())


def _finished_rows_turn_completed(srv: PrefectServer, run_id: str) -> None:
    """A partition whose subflow completed reads completed in the parent's live table while
    another still runs, not only once the whole run has ended (#43)."""
    said = {"demo_short": "completed", "demo_images": "completed", "demo_long": "running"}
    _wait(
        lambda: _rows_say(srv, run_id, said),
        lambda: _progress_artifact(srv, run_id)["description"],
        timeout_s=60,
    )


def _told_the_truth(srv: PrefectServer, run_id: str, before: float) -> dict[str, Any]:
    """The states and artifacts after a stop: the parent and demo_long Cancelled with a
    message a person writes, demo_short and demo_images Completed (in the API and in the
    summary), no task run Crashed, the progress no lower than before the stop."""
    run = srv.wait_final(run_id, timeout=120)
    assert run["state_type"] == "CANCELLED", run["state"]
    message = run["state"]["message"]
    assert "by stopped" not in message and "SIG" not in message.split(":")[0], message
    subs = _subflows(srv, run_id)
    states = {name: sub["state_type"] for name, sub in subs.items()}
    assert states == {
        "demo_short": "COMPLETED",
        "demo_images": "COMPLETED",
        "demo_long": "CANCELLED",
    }, states
    tasks = srv.post(
        "/task_runs/filter",
        {"flow_runs": {"id": {"any_": [s["id"] for s in subs.values()]}}, "limit": 200},
    )
    long_id = subs["demo_long"]["id"]
    crashed = [(t["name"], t["state"]["message"]) for t in tasks if t["state_type"] == "CRASHED"]
    assert not crashed, crashed
    stopped = {t["state_type"] for t in tasks if t["flow_run_id"] == long_id}
    assert "CANCELLED" in stopped and stopped <= {"CANCELLED", "COMPLETED"}, stopped
    [summary] = srv.post(
        "/artifacts/filter",
        {"artifacts": {"key": {"any_": [SUMMARY_KEY]}, "flow_run_id": {"any_": [run_id]}}},
    )
    rows = summary["data"] if isinstance(summary["data"], list) else json.loads(summary["data"])
    status = {r["partition"]: r["status"] for r in rows}
    assert status == {
        "demo_short": "completed",
        "demo_images": "completed",
        "demo_long": "cancelled",
    }, rows
    assert _progress(srv, run_id) >= before
    return run


def _after_signal(log: Path, offset: int) -> list[str]:
    return log.read_bytes()[offset:].decode(errors="replace").strip().splitlines()


def _quiet(lines: list[str]) -> None:
    text = "\n".join(lines)
    assert len(lines) <= 5, text
    for word in NOT_SAID:
        assert word not in text, text
    assert lines[-1].startswith("eagle3-datagen: stopped by SIGINT"), text


def _ctrl_c_once_logged(
    cfg: Path,
    env: dict[str, str],
    log: Path,
    text: str | Callable[[], bool],
    server_url: str | None = None,
) -> list[str]:
    """Ctrl-C once the run's log says ``text`` (or once ``text()`` holds); the lines it printed
    after the signal."""
    args = ("--server-url", server_url) if server_url else ()
    ready = text if callable(text) else (lambda: text in log.read_text())
    proc = _start(cfg, env, log, *args)
    try:
        _wait(ready, lambda: log.read_text()[-3000:])
        offset = log.stat().st_size
        os.killpg(proc.pid, signal.SIGINT)
        assert proc.wait(120) == 130, log.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
    return _after_signal(log, offset)


def _ctrl_c(srv: PrefectServer, cfg: Path, out: Path, log: Path, *args: str) -> None:
    proc = _start(cfg, srv.env, log, *args)
    try:
        run = _wait(lambda: _parent(srv, out), lambda: log.read_text()[-3000:])
        _wait(lambda: _one_finished(srv, run["id"]), lambda: log.read_text()[-3000:])
        _finished_rows_turn_completed(srv, run["id"])
        before = _progress(srv, run["id"])
        offset = log.stat().st_size
        os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does
        assert proc.wait(120) == 130, log.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
    _quiet(_after_signal(log, offset))
    _told_the_truth(srv, run["id"], before)


def test_ctrl_c_in_launch_mode(prefect_server: PrefectServer, tmp_path: Path) -> None:
    cfg, out = _config(tmp_path)
    log = tmp_path / "run.log"
    _ctrl_c(prefect_server, cfg, out, log)
    text = log.read_text()
    assert "relaunching" not in text and text.count("launched server pid") == 1, text
    for pidfile in (out / ".state" / "servers").glob("*.json"):
        pytest.fail(f"server left behind: {pidfile.read_text()}")


def test_ctrl_c_in_attach_mode(prefect_server: PrefectServer, tmp_path: Path) -> None:
    cfg, out = _config(tmp_path, attach=True)
    with EmulatorProcess(*SLOW_LONG, log_dir=tmp_path) as emulator:
        emulator.wait_ready()
        _ctrl_c(prefect_server, cfg, out, tmp_path / "run.log", "--server-url", emulator.url)
        assert emulator.proc.poll() is None, "the run stopped a server it did not start"


def test_ctrl_c_before_generation(prefect_server: PrefectServer, tmp_path: Path) -> None:
    """While the server loads: the run Cancelled, no subflow or task, a few quiet lines."""
    cfg, out = _config(tmp_path)
    config = yaml.safe_load(cfg.read_text())
    config["server"]["extra_args"] += ["--emu-startup-503-s", "60"]
    cfg.write_text(yaml.safe_dump(config))
    log = tmp_path / "run.log"
    srv = prefect_server
    _quiet(_ctrl_c_once_logged(cfg, srv.env, log, "launched server pid"))
    run = _parent(srv, out)
    assert run is not None and run["state_type"] == "CANCELLED", run
    assert not list((out / ".state" / "servers").glob("*.json")), "server left behind"


def test_cancel_from_the_ui(prefect_server: PrefectServer, deployed: Path, tmp_path: Path) -> None:
    srv = prefect_server
    config = demo_config(tmp_path / "out").model_dump(mode="json")
    config["server"]["extra_args"] += SLOW_LONG
    worker_log = deployed.read_bytes()
    offset = len(worker_log)
    run_id = srv.run_deployment("eagle3-datagen/demo", {"config": config})
    _wait(lambda: _one_finished(srv, run_id), lambda: srv.get(f"/flow_runs/{run_id}")["state"])
    before = _progress(srv, run_id)
    [pidfile] = list((tmp_path / "out" / ".state" / "servers").glob("*.json"))
    server = json.loads(pidfile.read_text())["pid"]
    # What the UI's Cancel button sends.
    srv.post(
        f"/flow_runs/{run_id}/set_state",
        {"state": {"type": "CANCELLING", "message": "cancelled from the UI"}, "force": True},
    )
    try:
        _told_the_truth(srv, run_id, before)
    except AssertionError as err:
        said = deployed.read_bytes()[offset:].decode(errors="replace")
        raise AssertionError(f"{err}\nworker log:\n{said[-12000:]}") from None
    _wait(lambda: not pid_alive(server), lambda: f"server {server} outlived its run", 60)
    said = deployed.read_bytes()[offset:].decode(errors="replace")
    for word in ("Traceback", "Crash detected", "server lost", "relaunching"):
        assert word not in said, said[-6000:]


def _all_waiting_to_retry(srv: PrefectServer, out: Path, log: Path, batches: int) -> bool:
    """Every batch of the run's one partition has failed its first attempt and waits in its
    retry's delay: ``batches`` task runs, each Running its second attempt, each having said
    so (the line comes just before the wait)."""
    run = _parent(srv, out)
    if run is None or log.read_text().count("retry 1 in 600 s") < batches:
        return False
    subs = _subflows(srv, run["id"])
    query = {"flow_runs": {"id": {"any_": [s["id"] for s in subs.values()]}}, "limit": 200}
    tasks = srv.post("/task_runs/filter", query)
    return len(tasks) == batches and all(
        t["state_type"] == "RUNNING" and t["run_count"] == 2 for t in tasks
    )


def test_ctrl_c_while_a_batch_waits_to_retry(prefect_server: PrefectServer, tmp_path: Path) -> None:
    """Batches whose requests all failed wait ten minutes before their retry; Ctrl-C meanwhile
    ends them Cancelled (the wait is the task's own, not Prefect's AwaitingRetry, where the stop
    would land in the engine and read Crashed). The stop lands once every batch is in that
    wait, a state the test waits for rather than hopes the timing gives."""
    srv = prefect_server
    with EmulatorProcess("--emu-fault-500-rate", "1.0", log_dir=tmp_path) as emulator:
        emulator.wait_ready()
        cfg, out = _config(tmp_path, attach=True)
        config = yaml.safe_load(cfg.read_text())
        config["partitions"] = config["partitions"][:1]  # demo_short: 64 lines, 4 batches
        config["retries"].update(
            max_attempts=1, backoff_initial_s=0.1, batch_retries=1, batch_retry_delay_s=[600]
        )
        cfg.write_text(yaml.safe_dump(config))
        log = tmp_path / "run.log"
        after = _ctrl_c_once_logged(
            cfg, srv.env, log, lambda: _all_waiting_to_retry(srv, out, log, 4), emulator.url
        )
    _quiet(after)
    run = _parent(srv, out)
    assert run is not None
    run = srv.wait_final(run["id"], timeout=120)
    assert run["state_type"] == "CANCELLED", run["state"]
    subs = _subflows(srv, run["id"])
    tasks = srv.post(
        "/task_runs/filter",
        {"flow_runs": {"id": {"any_": [s["id"] for s in subs.values()]}}, "limit": 200},
    )
    states = {t["name"]: t["state_type"] for t in tasks}
    assert len(states) == 4 and set(states.values()) == {"CANCELLED"}, states
