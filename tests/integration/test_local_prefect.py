"""The commands without PREFECT_API_URL (Prefect's local database, as a first run on a laptop
leaves it) and with a Prefect API that is down: each answer is one line, never a traceback.

Real child processes of the CLI, each with its own ``PREFECT_HOME``; the local database is the
one a real run left there.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from eagle3_datagen.demo import demo_config
from tests.support import free_port

pytestmark = pytest.mark.slow


def _cli(home: Path, *args: str, api: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env.update(PREFECT_HOME=str(home), PREFECT_SERVER_ANALYTICS_ENABLED="false")
    if api:
        env["PREFECT_API_URL"] = api
    cmd = [sys.executable, "-m", "eagle3_datagen_cli.main", *args]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=400)


@pytest.mark.timeout(600)  # two starts of Prefect's temporary server, one migrating a new database
def test_failures_reads_the_local_database_a_run_left(tmp_path: Path) -> None:
    home = tmp_path / "prefect-home"
    # Nothing there yet: one line that says so, and no server started for it.
    empty = _cli(home, "failures")
    assert empty.returncode == 2, empty.stderr
    assert empty.stderr.strip() == (
        f"eagle3-datagen: nothing to read: PREFECT_API_URL is not set and Prefect's local "
        f"database {home / 'prefect.db'} does not exist (no run without PREFECT_API_URL was made "
        "here)"
    )
    # A run without PREFECT_API_URL records into that database (a run that fails in the flow:
    # its server listens but never answers; a missing input, or a URL nothing listens at,
    # fails before Prefect starts) ...
    config = demo_config(tmp_path / "out").model_dump(mode="json")
    config["server"]["limits"]["startup_timeout_s"] = 2
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(config))
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(64)  # connections open (the kernel's backlog); nothing ever answers
    dead = f"http://127.0.0.1:{silent.getsockname()[1]}"
    with silent:
        run = _cli(home, "run", str(tmp_path / "run.yaml"), "--server-url", dead)
    assert run.returncode == 1, run.stderr[-3000:]
    # The terminal: no traceback; the last line is the reason and where the tracebacks are.
    lines = run.stderr.splitlines()
    assert not [line for line in lines if "Traceback" in line or line.startswith("  File ")]
    reason = f"server at {dead} not healthy after "  # 2 s, or 3 on a loaded machine
    assert lines[-1].startswith(f"eagle3-datagen: run failed: {reason}"), lines[-3:]
    assert "(log: uv run prefect flow-run logs " in lines[-1], lines[-3:]
    # ... and `failures` reads it back: which database, the run, its reason; no traceback, no
    # "database is locked" (Prefect's telemetry on the same database).
    out = _cli(home, "failures")
    assert out.returncode == 0, out.stderr[-3000:]
    where = f"Prefect's local database {home / 'prefect.db'} (PREFECT_API_URL is not set)"
    read, head = out.stdout.splitlines()[:2]
    assert read == f"read from {where}", out.stdout
    assert f"FAILED: {reason}" in head, out.stdout
    # Its wait is said before it starts.
    assert out.stderr.startswith(f"eagle3-datagen: using {where} through Prefect's temporary")
    assert "Traceback" not in out.stderr and "database is locked" not in out.stderr, out.stderr


def test_a_prefect_api_that_is_down_is_one_line(tmp_path: Path) -> None:
    api = f"http://127.0.0.1:{free_port()}/api"  # nothing listens there
    commands = (("alarm", "install", "--block", "eagle3-alerts"), ("alarm", "unschedulable"))
    for args in (*commands, ("failures",)):
        out = _cli(tmp_path, *args, api=api)
        assert out.returncode == 2, out.stderr
        assert out.stderr.strip() == (
            f"eagle3-datagen: cannot reach the Prefect API at {api}: All connection attempts "
            "failed; is the server running?"
        ), out.stderr
