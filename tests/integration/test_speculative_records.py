"""Records of a speculating server (a real emulator process, real HTTP, real Parquet): the spec
columns hold SGLang's per-request fields, null without speculation; validation checks them; the
card, the data picture and the history show the accept length and its slices."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from eagle3_datagen.config import PipelineConfig
from eagle3_datagen.generate.batch import PartitionRunner
from eagle3_datagen.generate.context import PartitionJob
from eagle3_datagen.generate.partition_context import PartitionContext
from eagle3_datagen.inputs.prompts import plan_batches
from eagle3_datagen.render.chat_tokenizer import ChatTokenizer
from eagle3_datagen.render.token_ids import TokenIds
from eagle3_datagen.report.acceptance import read_acceptance
from eagle3_datagen.report.data_picture import partition_picture, picture_markdown
from eagle3_datagen.report.dataset_card import refresh_dataset_card
from eagle3_datagen.report.history import history_entry, history_rows, history_text
from eagle3_datagen.report.throughput import RunMeter
from eagle3_datagen.sglang.client import SGLangClient
from eagle3_datagen.validate.dataset import spec_problem
from eagle3_datagen.write.records import SPEC_COLUMNS
from eagle3_datagen.write.shards import PartitionOutput
from tests.support import TOKENIZER_DIR
from tests.support.pipeline import records, run_batches

pytestmark = pytest.mark.tokens

TOOLS = [{"type": "function", "function": {"name": "get_time", "parameters": {}}}]


def _config(tmp_path: Path, lines: int = 40) -> PipelineConfig:
    path = tmp_path / "in.jsonl"
    with path.open("w") as fh:
        for i in range(lines):
            line: dict[str, Any] = {
                "id": f"r{i}",
                "messages": [{"role": "user", "content": f"question number {i} about speed"}],
            }
            if i % 4 == 0:
                line["tools"] = TOOLS
            fh.write(json.dumps(line) + "\n")
    return PipelineConfig.model_validate(
        {
            "model": {"path": str(TOKENIZER_DIR)},
            "tiers": [{"name": "T", "concurrency": 8, "max_tokens": 600}],
            "partitions": [{"name": "p", "input": str(path), "tier": "T"}],
            "output_dir": str(tmp_path / "out"),
            "batch_size": 10,
        }
    )


async def _run(config: PipelineConfig, url: str) -> tuple[PartitionOutput, RunMeter]:
    """Every batch of partition ``p`` through one runner whose progress a meter tracks."""
    tok = ChatTokenizer(str(TOKENIZER_DIR))
    meter = RunMeter()
    out = PartitionOutput(config.output_dir, "p")
    async with SGLangClient(url) as client:
        job = PartitionJob(config, "p", url)
        ctx = PartitionContext.build(job, tok, TokenIds.resolve(tok, config.special_tokens))
        runner = PartitionRunner(job, ctx, client)
        meter.track("p", runner.progress)
        for spec in plan_batches("p", config.partition("p").input, config.batch_size):
            await runner.run_batch(spec)
    return out, meter


def _speculating(tmp_path: Path) -> tuple[str, ...]:
    draft = tmp_path / "draft"
    draft.mkdir()
    return (
        "--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", str(draft),
        "--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
        "--speculative-num-draft-tokens", "4", "--emu-accept-length", "3.0",
        "--emu-mean-output-tokens", "150", "--random-seed", "0",
    )  # fmt: skip


async def test_a_speculating_server_s_records_keep_its_acceptance(
    tmp_path: Path, emulator_factory: Any
) -> None:
    emu = emulator_factory(*_speculating(tmp_path)).wait_ready()
    config = _config(tmp_path)
    out, meter = await _run(config, emu.url)
    rows = list(records(Path(config.output_dir), "p").values())
    assert len(rows) == 40
    for row in rows:
        if len(row["output_ids"]) > 1:
            assert row["spec_verify_ct"] > 0, row["id"]
            assert row["spec_num_proposed_drafts"] == 3 * row["spec_verify_ct"]
            assert row["spec_accept_length"] == pytest.approx(
                len(row["output_ids"]) / row["spec_verify_ct"]
            )
            assert 0.0 <= row["spec_accept_rate"] <= 1.0
        assert spec_problem(row) is None
        assert row["has_tools"] is (row["id"] in {f"r{i}" for i in range(0, 40, 4)})
    acc = read_acceptance(out.shard_paths())
    assert acc is not None
    assert acc.overall.accept_length == pytest.approx(3.0, abs=0.3)  # the profile's mean
    assert set(acc.slices["tools"]) == {"with tools", "no tools"}
    assert set(acc.slices["images"]) == {"text only"}

    # The progress line, the data picture, the card and the history say it.
    progress = meter.progress("p")
    assert progress is not None and "accept_len=" in progress.line()
    picture = partition_picture(config.output_dir, "p")
    assert "Acceptance" in picture_markdown(picture)
    assert "| tools | with tools |" in picture_markdown(picture)
    manifest = {"partitions": {"p": {"status": "completed"}}, "fingerprint": {}}
    refresh_dataset_card(config.output_dir, manifest)
    card = (Path(config.output_dir) / "README.md").read_text()
    assert "## Acceptance" in card and "| partition | p |" in card
    meter.finish("p")
    started = datetime(2026, 12, 1, tzinfo=UTC)
    entry = history_entry(
        config.output_dir,
        meter,
        {"p": "completed"},
        run_id="id",
        run_name="night",
        started=started,
        ended=started + timedelta(minutes=1),
    )
    numbers = entry["partitions"]["p"]
    assert numbers["spec_accept_length"] == pytest.approx(acc.overall.accept_length, abs=1e-3)
    assert "output_length" in numbers["acceptance"]["slices"]
    assert "accept len" in history_text(history_rows([entry]))


async def test_without_speculation_the_columns_are_null(
    tmp_path: Path, emulator_factory: Any
) -> None:
    emu = emulator_factory("--random-seed", "0", "--emu-mean-output-tokens", "50").wait_ready()
    config = _config(tmp_path, lines=10)
    out = await run_batches(config, emu.url)
    table = pq.read_table(out.shard_paths())
    for name in SPEC_COLUMNS:
        assert table[name].null_count == len(table), name
    assert read_acceptance(out.shard_paths()) is None
    picture = partition_picture(config.output_dir, "p")
    assert picture.acceptance is None and "Acceptance" not in picture_markdown(picture)


async def test_data_written_before_the_columns_still_reads(
    tmp_path: Path, emulator_factory: Any
) -> None:
    """A shard without the spec (and has_tools) columns, as older versions wrote them."""
    emu = emulator_factory("--random-seed", "0", "--emu-mean-output-tokens", "50").wait_ready()
    config = _config(tmp_path, lines=10)
    out = await run_batches(config, emu.url)
    for path in out.shard_paths():
        table = pq.read_table(path)
        old = table.drop_columns([*SPEC_COLUMNS, "has_tools"])
        pq.write_table(old, path)  # the fingerprint metadata goes too: not needed here
        assert pa.types.is_list(old.schema.field("output_ids").type)
    assert read_acceptance(out.shard_paths()) is None
    assert partition_picture(config.output_dir, "p").accepted == 10
    assert PartitionOutput(config.output_dir, "p").shard_paths()
