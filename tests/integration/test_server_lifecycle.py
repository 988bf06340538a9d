"""The launched server never outlives its run; attach never stops a server; keys stay secret."""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from eagle3_datagen.cli import run_pipeline
from eagle3_datagen.config import PipelineConfig
from eagle3_datagen.sglang.orphans import pid_alive
from tests.integration.test_resilience import base_config, ledger_entries, write_prompts

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
    from prefect.settings import PREFECT_API_URL

    prompts = tmp_path / "p.jsonl"
    write_prompts(prompts, 120)
    ledger = tmp_path / "ledger.jsonl"
    data = base_config(
        tmp_path,
        prompts,
        extra_args=["--emu-running-slots", "4", "--emu-decode-ms-per-token", "5",
                    "--emu-ledger", str(ledger)],
    )  # fmt: skip
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(yaml.safe_dump(data))
    out = Path(data["output_dir"])
    env = {**os.environ, "PREFECT_API_URL": str(PREFECT_API_URL.value())}
    cmd = [sys.executable, "-m", "eagle3_datagen.cli", "run", str(cfg)]
    first = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while len(ledger_entries(ledger)) < 10:
        assert first.poll() is None, first.stderr.read().decode()  # type: ignore[union-attr]
        assert time.monotonic() < deadline
        time.sleep(0.05)
    (server,) = _servers(out)
    assert pid_alive(server["pid"])
    first.send_signal(signal.SIGKILL)
    first.wait()

    second = subprocess.run(cmd, env=env, capture_output=True, timeout=300)
    assert second.returncode == 0, second.stderr.decode()[-3000:]
    assert not pid_alive(server["pid"]), "the killed run's server outlived it"
    assert _servers(out) == [], "the second run's server is stopped and its pidfile removed"


async def _prefect_text() -> str:
    from prefect.client.orchestration import get_client

    async with get_client() as client:
        logs = await client.read_logs(limit=200)
        artifacts = await client.read_artifacts(limit=200)
        runs = await client.read_flow_runs(limit=200)
    parts = [log.message for log in logs]
    parts += [json.dumps(a.data, default=str) + str(a.description) for a in artifacts]
    parts += [json.dumps(r.parameters, default=str) for r in runs]
    return "\n".join(parts)


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
    text = asyncio.run(_prefect_text())
    assert "launched server pid" in text  # the logs were really read
    assert key not in text


def test_api_key_from_a_prefect_secret_block(tmp_path: Path) -> None:
    from prefect.blocks.system import Secret

    key = "sk-" + secrets.token_hex(16)
    Secret(value=key).save("e3-test-sglang-key", overwrite=True)
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
