"""What a person at the terminal sees when batches fail: one line per retry and failure, the
run's reason as the last line, no traceback; the flow run's log on the Prefect API says the
same, one ERROR line per failed batch, its traceback at DEBUG only (a run that fails before its
server: ``test_local_prefect.py``).

The CLI runs as a child process against Prefect's real local backend; the failing server is a
real emulator process that answers every /generate with HTTP 500.
"""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest
import yaml

from eagle3_datagen.demo import demo_config
from tests.support.emulator import EmulatorProcess
from tests.support.pipeline import CliRun

pytestmark = [pytest.mark.usefixtures("prefect_backend"), pytest.mark.slow]


async def _logs(run_id: str) -> list[Any]:
    """The log of the flow run and of its subflows (and their tasks), from the API."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (
        FlowRunFilter,
        FlowRunFilterParentFlowRunId,
        LogFilter,
        LogFilterFlowRunId,
    )

    flow_run_id = UUID(run_id)
    async with get_client() as client:
        subs = await client.read_flow_runs(
            flow_run_filter=FlowRunFilter(
                parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=[flow_run_id])
            )
        )
        ids = [flow_run_id, *(sub.id for sub in subs)]
        logs = await client.read_logs(
            log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=ids))
        )
    return list(logs)


def _run(tmp_path: Path, config: dict[str, Any], *args: str) -> tuple[int, list[str]]:
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(config))
    run = CliRun(path, tmp_path / "run.log", *args)
    status = run.wait(300)
    return status, run.log.read_text(errors="replace").splitlines()


def _log_id(last_line: str) -> str:
    found = re.search(r"\(log: uv run prefect flow-run logs ([0-9a-f-]{36})\)$", last_line)
    assert found, last_line
    return found.group(1)


def test_failed_batches_read_as_one_line_each(tmp_path: Path) -> None:
    broken = EmulatorProcess("--emu-fault-500-rate", "1.0", log_dir=tmp_path).wait_ready()
    try:
        config = demo_config(tmp_path / "out").model_dump(mode="json")
        config["retries"].update(
            max_attempts=2, backoff_initial_s=0.1, batch_retries=1, batch_retry_delay_s=[0.2]
        )
        status, lines = _run(
            tmp_path, config, "--server-url", broken.url, "--partition", "demo_short"
        )
    finally:
        broken.stop()
    assert status == 1, lines[-20:]
    assert not [line for line in lines if "Traceback" in line or line.startswith("  File ")]
    # Each batch's retry and its final failure: one line each, naming the batch and cause.
    retried = [line for line in lines if "Retry 1/1" in line and "HTTP 500" in line]
    failed = [line for line in lines if "Retries are exhausted" in line and "HTTP 500" in line]
    assert len(retried) == len(failed) == 4, lines[-30:]
    assert lines[-1].startswith(
        "eagle3-datagen: run failed: 1 of 1 partitions failed (demo_short): 4 of 4 batches of "
        "partition demo_short failed"
    ), lines[-1]
    records = asyncio.run(_logs(_log_id(lines[-1])))
    logs = [r.message for r in records]
    exhausted = [m for m in logs if "Retries are exhausted" in m]
    assert len(exhausted) == 4 and not any("Traceback" in m for m in exhausted), exhausted
    assert not [m for m in logs if "Traceback" in m]
    # Each failed batch task: one ERROR line, its cause in it.
    errors = Counter(r.task_run_id for r in records if r.task_run_id and r.level >= 40)
    assert sorted(errors.values()) == [1, 1, 1, 1], [(r.level, r.message) for r in records]

    # `failures` names the same run's four batches.
    from prefect.settings import PREFECT_API_URL

    out = subprocess.run(
        [sys.executable, "-m", "eagle3_datagen_cli.main", "failures", _log_id(lines[-1])],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PREFECT_API_URL": str(PREFECT_API_URL.value())},
    ).stdout
    assert "4 failed batches:" in out, out
