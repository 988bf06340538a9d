"""A real ``prefect server`` (not the test harness), the repo's deployments, one process worker.

Everything goes through what a user has: the ``prefect`` CLI and the server's REST API (the same
API the UI reads). One server, one worker and one set of flow runs serve the whole module.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.prefect import PrefectServer, running_prefect_server


@pytest.fixture(scope="session")
def prefect_server() -> Iterator[PrefectServer]:
    """``prefect server start`` on a free port with its own PREFECT_HOME; ~20-40 s to start."""
    with running_prefect_server() as srv:
        yield srv


@pytest.fixture(scope="session")
def deployed(prefect_server: PrefectServer, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The work pool, the repo's deployments (as the README says) and one process worker."""
    srv = prefect_server
    srv.cli("work-pool", "create", "gpu-process", "--type", "process")
    srv.cli("work-pool", "create", "cpu-process", "--type", "process")
    srv.cli("--no-prompt", "deploy", "--all", "--prefect-file", "deployments/prefect.yaml")
    log = tmp_path_factory.mktemp("worker") / "worker.log"
    srv.start("worker", "start", "--pool", "gpu-process", "--name", "e2e-gpu-node", log=log)
    return log
