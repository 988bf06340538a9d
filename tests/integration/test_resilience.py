"""Nothing lost, nothing twice: chaos on the server, SIGKILLs of the pipeline, a changed config."""

from __future__ import annotations

import os
import signal
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from eagle3_datagen.config import PipelineConfig
from eagle3_datagen_cli.flow_run import run_pipeline
from tests.support.emulator import read_ledger
from tests.support.pipeline import CliRun, base_config, records, write_config
from tests.support.prompts import prompt_ids, write_prompts

pytestmark = pytest.mark.usefixtures("prefect_backend")


def test_chaos_server_faults_and_a_crash_still_give_every_id_once(tmp_path: Path) -> None:
    prompts = tmp_path / "prompts.jsonl"
    ids = prompt_ids(240)
    write_prompts(prompts, 240)
    faults = [
        "--emu-fault-seed",
        "7",
        "--emu-fault-503-rate",
        "0.05",
        "--emu-fault-reset-rate",
        "0.02",
        "--emu-fault-hang-rate",
        "0.01",
        "--emu-hang-s",
        "600",
        "--emu-crash-after",
        "150",
    ]
    data = base_config(
        tmp_path,
        prompts,
        extra_args=faults,
        max_relaunches=4,
        request_timeout_s=3,
        recovery_check_s=5,
    )
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


def _sent_since(ledger: Path, base: int, n: int) -> bool:
    return len(read_ledger(ledger)) - base >= n


@pytest.mark.slow
def test_sigkill_at_five_points_resumes_to_the_uninterrupted_dataset(
    tmp_path: Path, emulator_factory: Any
) -> None:
    prompts = tmp_path / "prompts.jsonl"
    ids = prompt_ids(240)
    write_prompts(prompts, 240)
    concurrency = 12
    ledger = tmp_path / "ledger.jsonl"
    slow = [
        "--emu-running-slots",
        str(concurrency),
        "--emu-decode-ms-per-token",
        "2",
        "--emu-mean-output-tokens",
        "120",
    ]
    emu = emulator_factory(*slow, ledger=ledger).wait_ready()

    def config_file(out: Path) -> Path:
        data = base_config(tmp_path, prompts)
        data["server"] = {"mode": "attach", "url": emu.url}
        data["tiers"][0]["concurrency"] = concurrency
        return write_config(data, out)

    # Uninterrupted reference run.
    ref = CliRun(config_file(tmp_path / "ref"), tmp_path / "ref.log")
    assert ref.wait(240) == 0, ref.output()
    reference = records(tmp_path / "ref", "chaos")
    base = len(read_ledger(ledger))

    killed_cfg = config_file(tmp_path / "killed")
    targets = (20, 60, 100, 140, 180)
    endings = []
    for target in targets:
        run = CliRun(killed_cfg, tmp_path / f"killed-{target}.log")
        run.wait_while_running(partial(_sent_since, ledger, base, target))
        os.kill(run.proc.pid, signal.SIGKILL)
        endings.append(run.proc.wait())
    # Each run died of the SIGKILL mid-way, none finished first (that would end with 0).
    assert endings == [-signal.SIGKILL] * len(targets), endings
    kills = len(targets)
    final = CliRun(killed_cfg, tmp_path / "final.log")
    assert final.wait(240) == 0, final.output()

    got = records(tmp_path / "killed", "chaos")
    assert sorted(got) == ids
    for pid in ids:
        assert got[pid]["prompt_ids"] == reference[pid]["prompt_ids"]
        assert got[pid]["output_ids"] == reference[pid]["output_ids"]
    # Only what was in flight at each kill was sent twice.
    sent = [e for e in read_ledger(ledger)[base:] if not e["rid"].startswith("preflight")]
    lines = [e["rid"].split(":")[-2] for e in sent]  # rid ends in line:attempt
    resent = len(lines) - len(set(lines))
    assert resent <= kills * concurrency, f"{resent} requests re-sent for {kills} kills"
