"""A real ``prefect server`` (not the test harness), the repo's deployments, one process worker.

Everything goes through what a user has: the ``prefect`` CLI and the server's REST API (the same
API the UI reads). One server, one worker and one set of flow runs serve the whole module.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.support import REPO, stop_processes
from tests.support.prefect import PrefectServer, running_prefect_server


def readme_deploy_commands(
    wanted: tuple[str, ...] = ("prefect work-pool create", "prefect --no-prompt"),
) -> list[str]:
    """The lines of README's "Operating it from the Prefect UI" block that start with
    ``wanted`` after ``uv run`` (default: the work-pool and deploy lines), without it."""
    text = (REPO / "README.md").read_text()
    section = text.split("## Operating it from the Prefect UI", 1)[1]
    block = re.search(r"```bash\n(.*?)```", section, re.S)
    assert block, "README: no bash block under 'Operating it from the Prefect UI'"
    lines = [line.split("  #", 1)[0].strip() for line in block.group(1).splitlines()]
    # README writes `uv run prefect ...` (a uv install); the tests run this environment's.
    commands = [
        c.removeprefix("uv run ") for c in lines if c.removeprefix("uv run ").startswith(wanted)
    ]
    assert len(commands) >= 2, commands
    return commands


@pytest.fixture(scope="session")
def prefect_server() -> Iterator[PrefectServer]:
    """``prefect server start`` on a free port with its own PREFECT_HOME; ~20-40 s to start."""
    with running_prefect_server() as srv:
        yield srv


@pytest.fixture(scope="session")
def deployed(prefect_server: PrefectServer, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The work pools, the repo's deployments and the workers, as the README says; returns the
    gpu-process worker's log."""
    srv = prefect_server
    commands = readme_deploy_commands()  # each run exactly as README gives it
    pools = [c for c in commands if c.startswith("prefect work-pool create")]
    # The pools at once (each command is a Python process, ~8 s of imports), then the workers,
    # which start while the deployments are made (their pools exist by then).
    with ThreadPoolExecutor(len(pools)) as ex:
        list(ex.map(lambda line: srv.cli(*shlex.split(line)[1:]), pools))
    logs = tmp_path_factory.mktemp("worker")
    for line in readme_deploy_commands(("prefect worker start",)):
        args = shlex.split(line)[1:]
        pool = args[args.index("--pool") + 1]
        srv.start(*args, "--name", f"e2e-{pool}", log=logs / f"{pool}.log")
    for line in commands:
        if line not in pools:
            srv.cli(*shlex.split(line)[1:])
    return logs / "gpu-process.log"


@pytest.fixture(autouse=True)
def stop_the_tests_own_workers(request: pytest.FixtureRequest) -> Iterator[None]:
    """Workers a test starts on the shared server stop when the test ends. Left polling (every
    second here), their queries and heartbeats held the server's SQLite lock for every later
    test: 'database is locked', 503s, and automations that fired late or not at all."""
    if "prefect_server" not in request.fixturenames:
        yield
        return
    srv: PrefectServer = request.getfixturevalue("prefect_server")
    before = len(srv.procs)  # the session's own (README workers) were started before this
    deployments = srv.deployments()
    yield
    if len(srv.procs) == before:
        return
    stop_processes(srv.procs[before:], 20)  # all at once: each idle worker exits in ~1 s
    del srv.procs[before:]
    # Such tests deploy partition-job onto their own pool; the README's deployments come back
    # as they were, for the tests after (test_readme_ready: every one Ready): through the REST
    # API where it can, else as the README's commands make them.
    if srv.restore_deployments(deployments):
        return
    for line in readme_deploy_commands():
        if line.startswith("prefect --no-prompt"):
            srv.cli(*shlex.split(line)[1:], check=False)
