"""Partition jobs (``run --partition``, the fan-out's unit) on one attached server that is
restarted between them: SGLang draws a new ``random_seed`` (and the emulator, like it, reports
another launch command) at each launch, and no job may be refused for it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from eagle3_datagen.config import PipelineConfig
from eagle3_datagen_cli.flow_run import run_pipeline
from tests.support.pipeline import base_config, records
from tests.support.prompts import write_prompts

pytestmark = pytest.mark.usefixtures("prefect_backend")


def test_partition_jobs_survive_server_restarts(tmp_path: Path, emulator_factory: Any) -> None:
    a_in = write_prompts(tmp_path / "a.jsonl", 6)
    b_in = write_prompts(tmp_path / "b.jsonl", 6, first=100)
    data = base_config(tmp_path, a_in)
    data["partitions"] = [
        {"name": "a", "input": str(a_in), "tier": "SHORT"},
        {"name": "b", "input": str(b_in), "tier": "SHORT"},
    ]
    seeds = []

    def job(partition: str) -> None:
        emu = emulator_factory("--context-length", "8192").wait_ready()  # no --random-seed
        seeds.append(httpx.get(f"{emu.url}/server_info").json()["random_seed"])
        data["server"] = {"mode": "attach", "url": emu.url}
        ok, result = run_pipeline(PipelineConfig.model_validate(data), partitions=[partition])
        emu.stop()
        assert ok, result

    job("a")
    job("b")  # another launch: another seed, port and launch command
    job("a")  # a rerun after a restart resumes
    assert len(set(seeds)) == 3
    out = Path(data["output_dir"])
    assert len(records(out, "a")) == 6 and len(records(out, "b")) == 6
