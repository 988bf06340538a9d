"""The history of runs: two nights on one output directory, each line this night's numbers."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from eagle3_datagen.config import PipelineConfig
from eagle3_datagen.inputs.prompts import plan_batches
from eagle3_datagen.report.history import (
    append_history,
    history_entry,
    history_rows,
    history_text,
    read_history,
)
from eagle3_datagen.report.throughput import RunMeter
from eagle3_datagen.sglang.client import SGLangClient
from eagle3_datagen.write.shards import PartitionOutput
from tests.support import TOKENIZER_DIR
from tests.support.pipeline import partition_runner
from tests.support.prompts import write_prompts


async def night(config: PipelineConfig, url: str, batches: int, name: str, day: int) -> None:
    """One run of partition ``p``: its first ``batches`` batches, then its history line."""
    meter = RunMeter()
    async with SGLangClient(url) as client:
        runner = partition_runner(config, client)
        meter.track("p", runner.progress)
        specs = list(plan_batches("p", config.partition("p").input, config.batch_size))
        for spec in specs[:batches]:
            await runner.run_batch(spec)
        meter.finish("p")
    started = datetime(2026, 11, day, 1, tzinfo=UTC)
    ended = started + timedelta(minutes=3)
    entry = history_entry(
        config.output_dir,
        meter,
        {"p": "completed"},
        run_id=f"id-{day}",
        run_name=name,
        started=started,
        ended=ended,
    )
    append_history(config.output_dir, entry)


def lengths_of(out: PartitionOutput, indices: range) -> list[int]:
    """Output lengths read back from the shards themselves (not from the commit markers)."""
    values: list[int] = []
    for i in indices:
        values += pq.read_table(out.shard_path(i)).column("completion_tokens").to_pylist()
    return sorted(values)


async def test_each_night_counts_only_its_own_batches(
    tmp_path: Path, emulator_factory: Any
) -> None:
    emu = emulator_factory("--emu-mean-output-tokens", "40").wait_ready()
    prompts = write_prompts(tmp_path / "in.jsonl", 40, words=8)
    config = PipelineConfig.model_validate(
        {
            "model": {"path": str(TOKENIZER_DIR)},
            "tiers": [{"name": "T", "concurrency": 8, "max_tokens": 256}],
            "partitions": [{"name": "p", "input": str(prompts), "tier": "T"}],
            "output_dir": str(tmp_path / "out"),
            "batch_size": 10,
        }
    )
    await night(config, emu.url, 2, "nightly-29", 29)  # stopped after 2 of 4 batches
    await night(config, emu.url, 4, "nightly-30", 30)  # resumes: batches 2 and 3 only

    first, second = read_history(config.output_dir)
    out = PartitionOutput(config.output_dir, "p")
    for entry, batches in ((first, range(2)), (second, range(2, 4))):
        p = entry["partitions"]["p"]
        lengths = lengths_of(out, batches)
        assert p["records"] == len(lengths) == 20
        assert p["output_p50"] == lengths[10] and p["output_p90"] == lengths[18]
        assert p["output_tokens"] == sum(lengths)
        assert p["reject_rate"] == 0 and p["accept_rate"] == 1
        assert p["tok_s"] > 0 and p["wall_s"] > 0
    assert second["wall_s"] == 180 and second["run_name"] == "nightly-30"

    rows = history_rows(read_history(config.output_dir))
    assert [r["run"] for r in rows] == ["nightly-29", "nightly-30"]
    text = history_text(rows).splitlines()
    assert text[0].split() == [
        "started",
        "(UTC)",
        "run",
        "partition",
        "status",
        "records",
        "lines",  # "lines ok": the share of lines accepted, never beside "accept len" unlabelled
        "ok",
        "rejected",
        "truncated",
        "tok/s",
        "out",
        "p50",
        "out",
        "p90",
        "wall",
    ]
    assert text[2].startswith("2026-11-30 01:00  nightly-30  p")
    assert history_rows(read_history(config.output_dir), ["other"]) == []
