"""Several servers behind one partition: both get load, and losing one loses no record."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
import yaml

from tests.support.emulator import read_ledger
from tests.support.pipeline import CliRun, base_config
from tests.support.prompts import prompt_ids, write_prompts

pytestmark = pytest.mark.usefixtures("prefect_backend")


@pytest.mark.slow
def test_two_servers_share_load_and_one_dying_loses_nothing(
    tmp_path: Path, emulator_factory: Any
) -> None:
    prompts = tmp_path / "prompts.jsonl"
    ids = prompt_ids(200)
    write_prompts(prompts, 200)
    slow = [
        "--emu-running-slots",
        "8",
        "--emu-decode-ms-per-token",
        "2",
        "--emu-mean-output-tokens",
        "100",
    ]
    ledger_a, ledger_b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    a = emulator_factory(*slow, ledger=ledger_a).wait_ready()
    b = emulator_factory(*slow, ledger=ledger_b).wait_ready()

    data = base_config(tmp_path, prompts)
    data["server"] = {"mode": "attach", "url": f"{a.url},{b.url}", "request_timeout_s": 30}
    data["tiers"][0]["concurrency"] = 16
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(yaml.safe_dump(data))
    run = CliRun(cfg, tmp_path / "run.log")

    def served(ledger: Path) -> set[str]:  # generation requests only, not the preflight one
        return {e["rid"] for e in read_ledger(ledger) if ":" in e["rid"]}

    run.wait_while_running(lambda: len(served(ledger_b)) >= 40)  # b did real work: now it dies
    b.proc.kill()
    b.proc.wait()
    assert run.wait(240) == 0, run.output()

    rows = pq.read_table(sorted((Path(data["output_dir"]) / "chaos").glob("part-*.parquet")))
    got = rows.column("id").to_pylist()
    assert sorted(got) == ids, "every input id exactly once"
    served_a, served_b = served(ledger_a), served(ledger_b)
    assert len(served_a) > 40 and len(served_b) >= 40, "both servers received load"
    assert len(served_a) > len(served_b), "after b died, a took the rest"
