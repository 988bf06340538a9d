"""A real ``prefect server`` (not the test harness) driven through its CLI and REST API, and a
webhook receiver standing in for Slack."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any

import httpx

from tests.support import REPO, free_port, stop_process, stop_processes

FINAL_STATES = {"COMPLETED", "FAILED", "CRASHED", "CANCELLED"}
# What a deployment read shows that follows from workers' polls or from the other fields.
_DEPLOYMENT_VOLATILE = {"updated", "updated_by", "status", "last_polled", "work_queue_id"}
# The fields of a deployment that PATCH /deployments/{id} sets (Prefect's DeploymentUpdate).
_DEPLOYMENT_PATCHABLE = {
    "version",
    "description",
    "paused",
    "concurrency_limit",
    "parameters",
    "tags",
    "path",
    "parameter_openapi_schema",
    "work_queue_name",
    "work_pool_name",
    "job_variables",
    "pull_steps",
    "entrypoint",
    "enforce_parameter_schema",
}


@dataclass
class PrefectServer:
    """The server subprocess and how to talk to it: REST for checks, CLI for actions."""

    api: str
    env: dict[str, str]
    home: Path
    port: int = 0
    server_env: dict[str, str] = field(default_factory=dict)
    server: subprocess.Popen[bytes] | None = None
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def start_server(self, timeout: float = 180) -> float:
        """Start ``prefect server start`` on ``port``; returns the seconds until /health."""
        started = time.monotonic()
        with open(self.home / "server.log", "ab") as log:
            self.server = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "prefect",
                    "server",
                    "start",
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(self.port),
                    "--analytics-off",
                ],
                env=self.server_env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        deadline = started + timeout
        while True:
            if self.server.poll() is not None:
                raise RuntimeError(
                    f"prefect server exited: {(self.home / 'server.log').read_text()}"
                )
            try:
                if httpx.get(f"{self.api}/health", timeout=2).status_code == 200:
                    return time.monotonic() - started
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"prefect server did not answer /api/health in {timeout} s")
            time.sleep(0.5)

    def stop_server(self) -> None:
        """SIGTERM the server by its pid (SIGKILL after 20 s)."""
        if self.server is not None:
            stop_process(self.server, 20)
            self.server = None

    def _request(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        """One REST call; a 503 is retried as Prefect's own client does (the server answers 503
        while its SQLite database is locked by another writer), then raised."""
        for attempt in range(6):
            r = httpx.request(method, f"{self.api}{path}", json=body, timeout=30)
            if r.status_code != 503 or attempt == 5:
                break
            time.sleep(0.5 * 2**attempt)
        r.raise_for_status()
        return r.json() if r.content else None

    def post(self, path: str, body: dict[str, Any] | None = None) -> Any:
        return self._request("POST", path, body or {})

    def delete(self, path: str) -> None:
        self._request("DELETE", path)

    def get(self, path: str) -> Any:
        return self._request("GET", path)

    def cli(self, *args: str, check: bool = True, timeout: float = 120) -> str:
        """``prefect ARGS`` as a user types it, from the repository root."""
        proc = subprocess.run(
            [sys.executable, "-m", "prefect", *args],
            cwd=REPO,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        out = proc.stdout + proc.stderr
        if check and proc.returncode != 0:
            raise AssertionError(f"prefect {' '.join(args)} exited {proc.returncode}:\n{out}")
        return out

    def datagen(self, *args: str) -> str:
        """``eagle3-datagen ARGS`` (the installed command) against this server; its stdout."""
        exe = Path(sys.executable).with_name("eagle3-datagen")
        proc = subprocess.run(
            [str(exe), *args], cwd=REPO, env=self.env, capture_output=True, text=True, timeout=120
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr
        return proc.stdout

    def start(self, *args: str, log: Path) -> subprocess.Popen[bytes]:
        """A long-running ``prefect`` subprocess (a worker), stopped at teardown by its pid."""
        with open(log, "wb") as fh:
            proc = subprocess.Popen(
                [sys.executable, "-m", "prefect", *args],
                cwd=REPO,
                env=self.env,
                stdout=fh,
                stderr=subprocess.STDOUT,
            )
        self.procs.append(proc)
        return proc

    def run_deployment(
        self, name: str, params: dict[str, Any], env: dict[str, str] | None = None
    ) -> str:
        """``prefect deployment run NAME --params JSON``; returns the flow run id. ``env``
        replaces the deployment's ``env`` job variable for this run."""
        extra = ["--job-variable", f"env={json.dumps(env)}"] if env is not None else []
        out = self.cli("deployment", "run", name, "--params", json.dumps(params), *extra)
        match = re.search(r"UUID: ([0-9a-f-]{36})", out)
        assert match, out
        return match.group(1)

    def deployments(self) -> dict[str, dict[str, Any]]:
        """Every deployment as the API reads it, by id."""
        return {d["id"]: d for d in self.post("/deployments/filter")}

    def restore_deployments(self, before: dict[str, dict[str, Any]]) -> bool:
        """Put the deployments back as ``before`` read them, through the REST API: one PATCH per
        changed deployment instead of a ``prefect deploy`` process (~10 s of imports each).
        False where that cannot bring back everything (a deployment gone, a field no PATCH
        sets); then the caller deploys again."""
        changed = _changed_deployment_fields(before, self.deployments())
        if changed is None or any(keys - _DEPLOYMENT_PATCHABLE for keys in changed.values()):
            return False
        for dep_id, keys in changed.items():
            self._request("PATCH", f"/deployments/{dep_id}", {k: before[dep_id][k] for k in keys})
        return _changed_deployment_fields(before, self.deployments()) == {}

    def wait_final(self, flow_run_id: str, timeout: float = 240) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            run = self.get(f"/flow_runs/{flow_run_id}")
            if run["state_type"] in FINAL_STATES:
                return dict(run)
            time.sleep(1.0)
        raise TimeoutError(f"flow run {flow_run_id} still {run['state_type']} after {timeout} s")


def _changed_deployment_fields(
    before: dict[str, dict[str, Any]], now: dict[str, dict[str, Any]]
) -> dict[str, set[str]] | None:
    """The fields of each of ``before``'s deployments that ``now`` reads differently (None: one
    of them is gone); only those that differ are listed."""
    if not before.keys() <= now.keys():
        return None
    changed = {
        dep_id: {
            k
            for k in dep.keys() | now[dep_id].keys()
            if k not in _DEPLOYMENT_VOLATILE and dep.get(k) != now[dep_id].get(k)
        }
        for dep_id, dep in before.items()
    }
    return {dep_id: keys for dep_id, keys in changed.items() if keys}


@contextlib.contextmanager
def running_prefect_server(database_url: str | None = None) -> Iterator[PrefectServer]:
    """``prefect server start`` on a free port with its own PREFECT_HOME; ~20-40 s to start.

    ``database_url`` (``postgresql+asyncpg://...``) puts it on that database instead of SQLite.
    """
    home = Path(tempfile.mkdtemp(prefix="e2e-prefect-"))
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env.update(
        PREFECT_HOME=str(home),
        PREFECT_SERVER_ANALYTICS_ENABLED="false",
        PREFECT_LOGGING_EXTRA_LOGGERS="eagle3_datagen",
        TRANSFORMERS_VERBOSITY="error",
    )
    server_env = dict(env)
    if database_url is not None:
        server_env["PREFECT_API_DATABASE_CONNECTION_URL"] = database_url
    api = f"http://127.0.0.1:{port}/api"
    # More retries than Prefect's 5 for the 503s a SQLite server answers while its database
    # is locked: on a loaded 2-core CI machine a burst outlasted them (a real deployment's
    # server is on Postgres: docs/scaling.md).
    client_env = dict(
        env, PREFECT_API_URL=api, PREFECT_WORKER_QUERY_SECONDS="1", PREFECT_CLIENT_MAX_RETRIES="10"
    )
    srv = PrefectServer(api=api, env=client_env, home=home, port=port, server_env=server_env)
    try:
        srv.start_server()
        yield srv
        stop_processes(srv.procs, 20)  # all at once: each idle worker exits in ~1 s
    finally:
        srv.stop_server()
    # Its database and logs go on a clean exit (an error raised in the block keeps them).
    shutil.rmtree(home, ignore_errors=True)


class Hook:
    """A webhook receiver standing in for Slack: collects the notifications it is sent."""

    def __init__(self) -> None:
        self.received: list[str] = []
        received = self.received

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("content-length", 0))
                received.append(self.rfile.read(length).decode())
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = HTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@dataclass
class Runs:
    """The module's flow runs, started together so their start-up overlaps."""

    demo: str
    failing: str
    invalid: str
    demo_dir: Path
    invalid_dir: Path
    hook: Hook


def notification_block(srv: PrefectServer, url: str) -> str:
    """A webhook notification block (what a user makes for Slack); returns its id."""
    code = (
        "from prefect.blocks.notifications import CustomWebhookNotificationBlock as B\n"
        f"b = B(name='e2e', url={url!r}, json_data={{'text': '{{{{subject}}}}|{{{{body}}}}'}})\n"
        "print(b.save('eagle3-alerts', overwrite=True))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        env=srv.env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    return out.strip().splitlines()[-1]
