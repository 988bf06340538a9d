"""The launched server never outlives its run; attach never stops a server; keys stay secret."""

from __future__ import annotations

import asyncio
import json
import secrets
import signal
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from pydantic import SecretStr

from eagle3_datagen.config import PipelineConfig
from eagle3_datagen.processes import pid_alive
from eagle3_datagen_cli.flow_run import run_pipeline
from tests.support.emulator import read_ledger
from tests.support.pipeline import CliRun, base_config
from tests.support.prompts import write_prompts

pytestmark = pytest.mark.usefixtures("prefect_backend")


def test_attach_mode_leaves_the_server_running(tmp_path: Path, emulator_factory: Any) -> None:
    emu = emulator_factory().wait_ready()
    prompts = tmp_path / "p.jsonl"
    write_prompts(prompts, 10)
    config = PipelineConfig.model_validate(base_config(tmp_path, prompts))
    ok, result = run_pipeline(config, server_url=emu.url)
    assert ok, result
    assert emu.proc.poll() is None
    assert httpx.get(f"{emu.url}/health", timeout=5).status_code == 200


def _servers(out: Path) -> list[dict[str, Any]]:
    return [json.loads(p.read_text()) for p in (out / ".state" / "servers").glob("*.json")]


@pytest.mark.slow
def test_sigkilled_run_leaves_no_server_after_the_next_run(tmp_path: Path) -> None:
    prompts = tmp_path / "p.jsonl"
    write_prompts(prompts, 120)
    ledger = tmp_path / "ledger.jsonl"
    data = base_config(
        tmp_path,
        prompts,
        extra_args=[
            "--emu-running-slots",
            "4",
            "--emu-decode-ms-per-token",
            "5",
            "--emu-ledger",
            str(ledger),
        ],
    )
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(yaml.safe_dump(data))
    out = Path(data["output_dir"])
    first = CliRun(cfg, tmp_path / "first.log")
    first.wait_while_running(lambda: len(read_ledger(ledger)) >= 10)
    (server,) = _servers(out)
    assert pid_alive(server["pid"])
    first.proc.send_signal(signal.SIGKILL)
    first.proc.wait()

    second = CliRun(cfg, tmp_path / "second.log")
    assert second.wait(300) == 0, second.output()
    assert not pid_alive(server["pid"]), "the killed run's server outlived it"
    assert _servers(out) == [], "the second run's server is stopped and its pidfile removed"


async def _prefect_text_of_run(output_dir: Path) -> tuple[str, int]:
    """Every log line, artifact and parameter set of the run that wrote ``output_dir`` (the
    parent flow run and its partition subflows), and how many log lines that was."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (
        ArtifactFilter,
        ArtifactFilterFlowRunId,
        FlowRunFilter,
        FlowRunFilterParentFlowRunId,
        LogFilter,
        LogFilterFlowRunId,
    )
    from prefect.client.schemas.objects import Log
    from prefect.client.schemas.sorting import FlowRunSort
    from prefect.logging.handlers import APILogHandler

    await APILogHandler.aflush()  # logs reach the API in the background: send what is queued
    async with get_client() as client:
        recent = await client.read_flow_runs(sort=FlowRunSort.START_TIME_DESC, limit=200)
        (parent,) = [  # the subflows get the same config; the parent has no parent task
            r
            for r in recent
            if (r.parameters.get("config") or {}).get("output_dir") == str(output_dir)
            and r.parent_task_run_id is None
        ]
        children = await client.read_flow_runs(
            flow_run_filter=FlowRunFilter(
                parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=[parent.id])
            )
        )
        runs = [parent, *children]
        ids = [r.id for r in runs]
        logs: list[Log] = []
        while True:  # page through all of them: the server caps one read at 200
            page = await client.read_logs(
                log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=ids)),
                limit=200,
                offset=len(logs),
            )
            logs += page
            if len(page) < 200:
                break
        artifacts = await client.read_artifacts(
            artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=ids))
        )
    assert children, "the run's partition subflow was not found"
    assert {log.flow_run_id for log in logs} == set(ids), "every flow run of the run logged"
    parts = [log.message for log in logs]
    parts += [json.dumps(a.data, default=str) + str(a.description) for a in artifacts]
    parts += [json.dumps(r.parameters, default=str) for r in runs]
    return "\n".join(parts), len(logs)


def test_api_key_never_appears_in_logs_artifacts_or_output(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    key = "sk-" + secrets.token_hex(16)
    monkeypatch.setenv("E3_TEST_SGLANG_KEY", key)
    prompts = tmp_path / "p.jsonl"
    write_prompts(prompts, 20)
    data = base_config(tmp_path, prompts, api_key_env="E3_TEST_SGLANG_KEY")
    ok, result = run_pipeline(PipelineConfig.model_validate(data))
    assert ok, result

    out = Path(data["output_dir"])
    files = [p for p in out.rglob("*") if p.is_file()]
    assert any(p.suffix == ".log" for p in files)
    for path in files:
        assert key.encode() not in path.read_bytes(), f"API key found in {path}"
    assert key not in json.dumps(result, default=str)
    text, n_logs = asyncio.run(_prefect_text_of_run(out))
    assert n_logs >= 10, f"only {n_logs} log lines of this run were read"
    assert "launched server pid" in text  # the run's own logs, not another run's
    assert key not in text


def test_api_key_from_a_prefect_secret_block(tmp_path: Path) -> None:
    from prefect.blocks.system import Secret

    key = "sk-" + secrets.token_hex(16)
    Secret(value=SecretStr(key)).save("e3-test-sglang-key", overwrite=True)
    prompts = tmp_path / "p.jsonl"
    write_prompts(prompts, 5)
    data = base_config(tmp_path, prompts, api_key_secret="e3-test-sglang-key")
    ok, result = run_pipeline(PipelineConfig.model_validate(data))
    assert ok, result  # the emulator refuses every request without the key (401)
    log = next((Path(data["output_dir"]) / "logs").glob("server-*.log")).read_bytes()
    assert key.encode() not in log

    data = base_config(tmp_path / "missing", prompts, api_key_secret="no-such-block")
    ok, reason = run_pipeline(PipelineConfig.model_validate(data))
    assert not ok and "no Prefect Secret block 'no-such-block'" in str(reason)
