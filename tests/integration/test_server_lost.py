"""A server gone for good fails the run fast and clearly; what was committed stays committed."""

from __future__ import annotations

import os
import signal
import time
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import yaml

from eagle3_datagen.write.shards import PartitionOutput
from tests.support.emulator import read_ledger
from tests.support.pipeline import CliRun, base_config, records
from tests.support.prompts import prompt_ids, write_prompts

pytestmark = pytest.mark.usefixtures("prefect_backend")

HEALTH_DEADLINE_S = 10


def _generated(ledger: Path, n: int) -> bool:
    return sum(1 for e in read_ledger(ledger) if not e["rid"].startswith("preflight")) >= n


def test_an_attached_server_killed_mid_run_fails_it_within_the_health_deadline(
    tmp_path: Path, emulator_factory: Any
) -> None:
    prompts = tmp_path / "prompts.jsonl"
    write_prompts(prompts, 1200, words=20)
    ledger = tmp_path / "ledger.jsonl"
    emu = emulator_factory(
        "--emu-running-slots", "8", "--emu-decode-ms-per-token", "1", ledger=ledger
    ).wait_ready()
    data = base_config(tmp_path, prompts)
    data["server"] = {
        "mode": "attach",
        "url": emu.url,
        "recovery_check_s": HEALTH_DEADLINE_S,
        "request_timeout_s": 30,
    }
    data["tiers"][0]["concurrency"] = 8
    data["batch_size"] = 8  # 150 batches
    cfg = tmp_path / "run.yaml"
    cfg.write_text(yaml.safe_dump(data))

    run = CliRun(cfg, tmp_path / "run.log")
    run.wait_while_running(partial(_generated, ledger, 100), timeout_s=180)
    os.kill(emu.proc.pid, signal.SIGKILL)
    killed_at = time.monotonic()
    status = run.wait(HEALTH_DEADLINE_S + 30 + 60)  # fails the test if much too slow
    took = time.monotonic() - killed_at
    assert status != 0, run.output()
    assert took <= HEALTH_DEADLINE_S + 30, f"the run took {took:.0f} s to fail:\n{run.output()}"
    out = run.output()
    assert f"server {emu.url} lost for good" in out
    assert "last answered at" in out and "last request error:" in out

    # Batches committed before the kill stay committed, and a rerun against a server that is
    # back completes the dataset: every id once.
    output = PartitionOutput(data["output_dir"], "chaos")
    committed = output.batch_summaries()
    assert 0 < len(committed) < 150
    before = {m.index for m in committed}
    emu2 = emulator_factory().wait_ready()
    data["server"]["url"] = emu2.url
    cfg.write_text(yaml.safe_dump(data))
    rerun = CliRun(cfg, tmp_path / "rerun.log")
    assert rerun.wait(240) == 0, rerun.output()
    assert sorted(records(Path(data["output_dir"]), "chaos")) == prompt_ids(1200)
    assert before <= {m.index for m in output.batch_summaries()}
