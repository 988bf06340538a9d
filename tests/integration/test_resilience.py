"""Nothing lost, nothing twice: chaos on the server, SIGKILLs of the pipeline, a changed config."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import orjson
import pyarrow.parquet as pq
import pytest
import yaml

from eagle3_datagen.cli import run_pipeline
from eagle3_datagen.config import PipelineConfig
from eagle3_datagen.demo import TOKENIZER_DIR, free_port

pytestmark = pytest.mark.usefixtures("prefect_backend")


def write_prompts(path: Path, n: int) -> list[str]:
    ids = []
    with path.open("w") as fh:
        for i in range(n):
            pid = f"p{i:04d}"
            ids.append(pid)
            row: dict[str, Any] = {"id": pid, "messages": [{"role": "user", "content": f"q {i}"}]}
            if i % 5 == 0:
                row["tools"] = [{"type": "function", "function": {"name": "lookup"}}]
            fh.write(json.dumps(row) + "\n")
    return ids


def base_config(tmp_path: Path, prompts: Path, **server: Any) -> dict[str, Any]:
    return {
        "model": {"path": str(TOKENIZER_DIR)},
        "server": {
            "mode": "launch",
            "engine": "emulator",
            "port": free_port(),
            "startup_timeout_s": 60,
            "request_timeout_s": 60,
            **server,
        },
        "tiers": [{"name": "SHORT", "concurrency": 16, "max_tokens": 2048}],
        "partitions": [{"name": "chaos", "input": str(prompts), "tier": "SHORT"}],
        "output_dir": str(tmp_path / "out"),
        "batch_size": 32,
        "retries": {"max_attempts": 8, "backoff_initial_s": 0.05, "backoff_max_s": 0.5},
    }


def records(output_dir: Path, partition: str) -> dict[str, dict[str, Any]]:
    rows = pq.read_table(sorted((output_dir / partition).glob("part-*.parquet"))).to_pylist()
    ids = [r["id"] for r in rows]
    assert len(ids) == len(set(ids)), "an id was written twice"
    return {r["id"]: r for r in rows}


def test_chaos_server_faults_and_a_crash_still_give_every_id_once(tmp_path: Path) -> None:
    prompts = tmp_path / "prompts.jsonl"
    ids = write_prompts(prompts, 240)
    faults = ["--emu-fault-seed", "7", "--emu-fault-503-rate", "0.05", "--emu-fault-reset-rate",
              "0.02", "--emu-fault-hang-rate", "0.01", "--emu-hang-s", "600",
              "--emu-crash-after", "150"]  # fmt: skip
    data = base_config(tmp_path, prompts, extra_args=faults, max_relaunches=4,
                       request_timeout_s=3, recovery_check_s=5)  # fmt: skip
    config = PipelineConfig.model_validate(data)
    ok, result = run_pipeline(config)
    assert ok, result
    assert isinstance(result, dict)
    got = records(Path(config.output_dir), "chaos")
    assert sorted(got) == ids
    assert result["partitions"]["chaos"]["rejected"] == 0
    # The crash really happened and a second server finished the job.
    log = next((Path(config.output_dir) / "logs").glob("server-*.log")).read_text()
    assert log.count("=== ") >= 2, "the server was never relaunched"


def test_rerun_with_changed_sampling_is_refused_and_names_it(tmp_path: Path) -> None:
    prompts = tmp_path / "prompts.jsonl"
    write_prompts(prompts, 20)
    data = base_config(tmp_path, prompts)
    ok, result = run_pipeline(PipelineConfig.model_validate(data))
    assert ok, result
    data["sampling"] = {"temperature": 0.6}
    ok, reason = run_pipeline(PipelineConfig.model_validate(data))
    assert not ok
    assert "sampling.temperature: 1.0 -> 0.6" in str(reason)
    assert "--overwrite" in str(reason)
    # The same config again is fine: it resumes (nothing left to do) instead of refusing.
    data["sampling"] = {}
    ok, result = run_pipeline(PipelineConfig.model_validate(data))
    assert ok, result


def ledger_entries(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    data = path.read_bytes()
    complete = data[: data.rfind(b"\n") + 1]  # the emulator may be mid-way through a line
    return [orjson.loads(x) for x in complete.splitlines() if x.strip()]


@pytest.mark.slow
def test_sigkill_at_five_points_resumes_to_the_uninterrupted_dataset(
    tmp_path: Path, emulator_factory: Any
) -> None:
    from prefect.settings import PREFECT_API_URL

    prompts = tmp_path / "prompts.jsonl"
    ids = write_prompts(prompts, 240)
    concurrency = 12
    ledger = tmp_path / "ledger.jsonl"
    slow = ["--emu-running-slots", str(concurrency), "--emu-decode-ms-per-token", "2",
            "--emu-mean-output-tokens", "120"]  # fmt: skip
    emu = emulator_factory(*slow, ledger=ledger).wait_ready()

    def config_file(out: Path) -> Path:
        data = base_config(tmp_path, prompts)
        data["server"] = {"mode": "attach", "url": emu.url}
        data["tiers"][0]["concurrency"] = concurrency
        data["output_dir"] = str(out)
        path = out.parent / f"{out.name}.yaml"
        path.write_text(yaml.safe_dump(data))
        return path

    env = {**os.environ, "PREFECT_API_URL": str(PREFECT_API_URL.value())}

    def start(cfg: Path) -> subprocess.Popen[bytes]:
        cmd = [sys.executable, "-m", "eagle3_datagen.cli", "run", str(cfg)]
        return subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    # Uninterrupted reference run.
    ref = start(config_file(tmp_path / "ref"))
    assert ref.wait(240) == 0, ref.stderr.read().decode()  # type: ignore[union-attr]
    reference = records(tmp_path / "ref", "chaos")
    base = len(ledger_entries(ledger))

    killed_cfg = config_file(tmp_path / "killed")
    kills = 0
    for target in (20, 60, 100, 140, 180):
        proc = start(killed_cfg)
        deadline = time.monotonic() + 120
        while len(ledger_entries(ledger)) - base < target:
            assert proc.poll() is None, proc.stderr.read().decode()  # type: ignore[union-attr]
            assert time.monotonic() < deadline, "pipeline made no progress"
            time.sleep(0.02)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        kills += 1
    final = start(killed_cfg)
    assert final.wait(240) == 0, final.stderr.read().decode()  # type: ignore[union-attr]

    got = records(tmp_path / "killed", "chaos")
    assert sorted(got) == ids
    for pid in ids:
        assert got[pid]["prompt_ids"] == reference[pid]["prompt_ids"]
        assert got[pid]["output_ids"] == reference[pid]["output_ids"]
    # Only what was in flight at each kill was sent twice.
    sent = [e for e in ledger_entries(ledger)[base:] if not e["rid"].startswith("preflight")]
    lines = [e["rid"].split(":")[1] for e in sent]
    resent = len(lines) - len(set(lines))
    assert kills == 5
    assert resent <= kills * concurrency, f"{resent} requests re-sent for {kills} kills"
