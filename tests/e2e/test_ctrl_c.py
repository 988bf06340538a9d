"""Ctrl-C and SIGTERM on ``eagle3-datagen run``: the run stops within seconds, its server and
Prefect's temporary API server stop, the flow run is Cancelled, one line, exit 130, and the
rerun finishes exactly (every prompt once)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml

from eagle3_datagen.demo import demo_config
from eagle3_datagen.processes import pid_alive
from tests.support import REPO
from tests.support.prefect import PrefectServer
from tests.support.servers import wait_gone

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def _config(tmp_path: Path) -> tuple[Path, Path]:
    out = tmp_path / "out"
    config = demo_config(out).model_dump(mode="json")
    # Slow enough that the run is still generating when it is stopped (the signal follows the
    # third answer; all of it takes ~20 s), fast enough that the rerun does not wait minutes.
    config["server"]["extra_args"] += [
        "--emu-decode-ms-per-token",
        "5",
        "--emu-running-slots",
        "4",
    ]
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(config))
    return path, out


def _start(cfg: Path, env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    """The command as a terminal starts it: its own process group (Ctrl-C goes to the group)."""
    exe = Path(sys.executable).with_name("eagle3-datagen")
    with log.open("wb") as fh:
        return subprocess.Popen(
            [str(exe), "run", str(cfg)],
            cwd=REPO,
            env=env,
            stdout=fh,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def _generating(proc: subprocess.Popen[bytes], out: Path, log: Path) -> int:
    """Wait until requests reach the server; return the server's pid."""
    ledger = out / "emulator-ledger.jsonl"
    deadline = time.monotonic() + 300
    while not (ledger.exists() and ledger.read_bytes().count(b"\n") >= 3):
        assert proc.poll() is None, log.read_text()[-3000:]
        assert time.monotonic() < deadline, log.read_text()[-3000:]
        time.sleep(0.2)
    [pidfile] = list((out / ".state" / "servers").glob("*.json"))
    return int(json.loads(pidfile.read_text())["pid"])


def _cmdline(pid: int) -> bytes:
    return Path(f"/proc/{pid}/cmdline").read_bytes()


def _lines(files: list[Path]) -> list[int]:
    return [
        i for f in files for i in pq.read_table(f, columns=["source_line"]).column(0).to_pylist()
    ]


def _children(pid: int) -> list[int]:
    text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    return [int(p) for p in text.split()]


def _stopped_as_promised(proc: subprocess.Popen[bytes], log: Path, server: int, name: str) -> str:
    started = time.monotonic()
    code = proc.wait(120)
    took = time.monotonic() - started
    text = log.read_text()
    assert code == 130, text[-3000:]
    assert took < 60, f"took {took:.0f} s to stop"
    last = text.strip().splitlines()[-1]
    assert last.startswith(
        f"eagle3-datagen: stopped by {name}: the run stopped and is marked Cancelled"
    ), text[-3000:]
    assert wait_gone(server, 30), "the run's server outlived it"
    return text


def test_ctrl_c_to_the_group_without_a_prefect_server(tmp_path: Path) -> None:
    cfg, out = _config(tmp_path)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env["PREFECT_HOME"] = str(tmp_path / "prefect-home")
    log = tmp_path / "run.log"
    proc = _start(cfg, env, log)
    server = _generating(proc, out, log)
    api_servers = [p for p in _children(proc.pid) if b"prefect.server.api" in _cmdline(p)]
    assert len(api_servers) == 1
    os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does
    _stopped_as_promised(proc, log, server, "SIGINT")
    assert wait_gone(api_servers[0], 30), "Prefect's temporary API server outlived the command"


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_signal_to_the_command_alone_cancels_and_the_rerun_is_exact(
    prefect_server: PrefectServer, tmp_path: Path, signum: signal.Signals
) -> None:
    cfg, out = _config(tmp_path)
    log = tmp_path / "run.log"
    proc = _start(cfg, prefect_server.env, log)
    server = _generating(proc, out, log)
    proc.send_signal(signum)
    _stopped_as_promised(proc, log, server, signum.name)
    query = {"flow_runs": {"name": {"like_": "out: "}}, "sort": "START_TIME_DESC", "limit": 1}
    runs = prefect_server.post("/flow_runs/filter", query)
    [run] = runs
    assert run["state_type"] == "CANCELLED", run["state"]
    # The run's own words: what had completed and what a rerun finishes.
    assert run["state"]["message"].startswith("stopped before it finished: "), run["state"]
    subs = prefect_server.post(
        "/flow_runs/filter", {"flow_runs": {"parent_flow_run_id": {"any_": [run["id"]]}}}
    )
    assert subs and {s["state_type"] for s in subs} <= {"CANCELLED", "COMPLETED"}

    # The rerun finishes what is missing: every prompt exactly once.
    rerun = _start(cfg, prefect_server.env, tmp_path / "rerun.log")
    assert rerun.wait(400) == 0, (tmp_path / "rerun.log").read_text()[-3000:]
    for part, size in (("demo_short", 64), ("demo_long", 24)):
        ids = _lines(sorted((out / part).glob("part-*.parquet")))
        rejects = _lines(sorted((out / part / "rejects").glob("*.parquet")))
        assert sorted(ids + rejects) == list(range(1, size + 1)), part
    assert not pid_alive(server)
