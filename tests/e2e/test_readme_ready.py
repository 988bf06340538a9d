"""README's operating section, followed as written, leaves every deployment Ready."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.support.prefect import PrefectServer

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def test_every_deployment_is_ready(prefect_server: PrefectServer, deployed: Path) -> None:
    deadline = time.monotonic() + 120
    while True:
        found = {d["name"]: d["status"] for d in prefect_server.post("/deployments/filter")}
        if len(found) >= 4 and set(found.values()) == {"READY"}:
            break
        assert time.monotonic() < deadline, f"not every deployment is Ready: {found}"
        time.sleep(1)
    assert {"kimi-k2.5", "demo", "partition-job", "kimi-k2.5-fanout"} <= set(found)
