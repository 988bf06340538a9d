"""Several servers behind one partition: both get load, and losing one loses no record."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
import yaml

from tests.integration.test_resilience import base_config, ledger_entries, write_prompts

pytestmark = pytest.mark.usefixtures("prefect_backend")


@pytest.mark.slow
def test_two_servers_share_load_and_one_dying_loses_nothing(
    tmp_path: Path, emulator_factory: Any
) -> None:
    from prefect.settings import PREFECT_API_URL

    prompts = tmp_path / "prompts.jsonl"
    ids = write_prompts(prompts, 200)
    slow = ["--emu-running-slots", "8", "--emu-decode-ms-per-token", "2",
            "--emu-mean-output-tokens", "100"]  # fmt: skip
    ledger_a, ledger_b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    a = emulator_factory(*slow, ledger=ledger_a).wait_ready()
    b = emulator_factory(*slow, ledger=ledger_b).wait_ready()

    data = base_config(tmp_path, prompts)
    data["server"] = {"mode": "attach", "url": f"{a.url},{b.url}", "request_timeout_s": 30}
    data["tiers"][0]["concurrency"] = 16
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(yaml.safe_dump(data))
    env = {**os.environ, "PREFECT_API_URL": str(PREFECT_API_URL.value())}
    proc = subprocess.Popen(
        [sys.executable, "-m", "eagle3_datagen.cli", "run", str(cfg)],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip

    deadline = time.monotonic() + 120

    def served(ledger: Path) -> set[str]:  # generation requests only, not the preflight one
        return {e["rid"] for e in ledger_entries(ledger) if ":" in e["rid"]}

    while len(served(ledger_b)) < 40:  # b has done real work: now it dies
        assert proc.poll() is None, proc.stderr.read().decode()  # type: ignore[union-attr]
        assert time.monotonic() < deadline
        time.sleep(0.02)
    b.proc.kill()
    b.proc.wait()
    _out, err = proc.communicate(timeout=240)
    assert proc.returncode == 0, err.decode()[-3000:]

    rows = pq.read_table(sorted((Path(data["output_dir"]) / "chaos").glob("part-*.parquet")))
    got = rows.column("id").to_pylist()
    assert sorted(got) == ids, "every input id exactly once"
    served_a, served_b = served(ledger_a), served(ledger_b)
    assert len(served_a) > 40 and len(served_b) >= 40, "both servers received load"
    assert len(served_a) > len(served_b), "after b died, a took the rest"
