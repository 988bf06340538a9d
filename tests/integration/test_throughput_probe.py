"""Without throughput.expected_tok_s, a run measures its own rate after the warm-up and logs
it as the alarm's baseline (a real run through the CLI against the emulator)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.pipeline import CliRun, base_config
from tests.support.prompts import write_prompts

pytestmark = pytest.mark.usefixtures("prefect_backend")


def test_a_run_without_an_expected_rate_logs_its_measured_baseline(
    tmp_path: Path, emulator_factory: Any
) -> None:
    slow = ["--emu-running-slots", "8", "--emu-decode-ms-per-token", "2"]
    emu = emulator_factory(*slow).wait_ready()
    data = base_config(tmp_path, write_prompts(tmp_path / "prompts.jsonl", 120))
    data["server"] = {"mode": "attach", "url": emu.url}
    data["tiers"][0]["concurrency"] = 8
    data["throughput"] = {"warmup_s": 0.5, "probe_s": 1.0, "window_s": 1.0}
    cfg = tmp_path / "run.yaml"
    cfg.write_text(yaml.safe_dump(data))
    run = CliRun(cfg, tmp_path / "run.log")
    assert run.wait(240) == 0, run.output()
    log = (tmp_path / "run.log").read_text(errors="replace")
    found = re.search(r"throughput baseline (\d+) output tok/s, measured over", log)
    assert found, log[-3000:]
    # 8 slots at 2 ms per token make at most 4,000 tok/s; the probe saw a real, running rate.
    assert 0 < int(found.group(1)) <= 4000
