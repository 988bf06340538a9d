"""The whole pipeline on Prefect's real local backend with the emulator as a real process."""

from __future__ import annotations

import hashlib
import json
import struct
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from eagle3_datagen.config import PipelineConfig
from eagle3_datagen.demo import demo_config
from eagle3_datagen.render.chat_tokenizer import ChatTokenizer
from eagle3_datagen_cli.flow_run import run_pipeline
from eagle3_datagen_cli.main import main
from tests.support.emulator import read_ledger
from tests.support.prompts import expected_prompt_ids

pytestmark = [pytest.mark.usefixtures("prefect_backend"), pytest.mark.tokens]


def sha256_int32(ids: list[int]) -> str:
    """The ledger's prompt fingerprint, computed here independently: sha256 of int32 LE ids."""
    return hashlib.sha256(struct.pack(f"<{len(ids)}i", *ids)).hexdigest()


def input_lines(path: str) -> dict[int, dict[str, Any] | None]:
    out: dict[int, dict[str, Any] | None] = {}
    for n, line in enumerate(Path(path).read_text().splitlines(), start=1):
        try:
            out[n] = json.loads(line)
        except json.JSONDecodeError:
            out[n] = None
    return out


def test_demo_dataset_holds_exact_tokens(
    tmp_path: Path, chat_tokenizer: ChatTokenizer, capsys: pytest.CaptureFixture[str]
) -> None:
    config = demo_config(tmp_path / "out")
    ok, manifest = run_pipeline(config)
    assert ok, manifest
    assert isinstance(manifest, dict)
    ledger = {e["rid"]: e for e in read_ledger(Path(config.output_dir) / "emulator-ledger.jsonl")}
    tok = chat_tokenizer.tok

    for part in config.partitions:
        lines = input_lines(part.input)
        pdir = Path(config.output_dir) / part.name
        table = pq.read_table(sorted(pdir.glob("part-*.parquet")))
        rows = table.to_pylist()
        assert rows, f"no records for {part.name}"
        rejects_files = sorted((pdir / "rejects").glob("*.parquet"))
        rejects = pq.read_table(rejects_files).to_pylist() if rejects_files else []
        # Nothing dropped silently: every input line is accepted or rejected, once.
        seen = sorted([r["source_line"] for r in rows] + [r["source_line"] for r in rejects])
        assert seen == sorted(lines)

        for row in rows:
            src = lines[row["source_line"]]
            assert src is not None
            assert row["prompt_ids"] == expected_prompt_ids(tok, src, config.model.render)
            # what the server received and sent, as its ledger recorded it
            received = ledger[row["rid"]]
            # an image prompt: the server saw (and counted) the ids with its images expanded
            seen = row["model_prompt_ids"] if row["images"] else row["prompt_ids"]
            assert received["input_ids_sha256"] == sha256_int32(seen)
            assert received["prompt_tokens"] == len(seen) == row["prompt_tokens"]
            assert row["output_ids"] == received["output_ids"]
            assert row["completion_tokens"] == len(row["output_ids"])
            assert row["partition"] == part.name
            assert row["finish_reason"] in ("stop", "length")
        summary = manifest["partitions"][part.name]
        assert summary["accepted"] == len(rows)
        assert summary["rejected"] == len(rejects)

    short_rejects = pq.read_table(
        sorted((Path(config.output_dir) / "demo_short" / "rejects").glob("*.parquet"))
    ).to_pylist()
    by_id = {r["id"]: r for r in short_rejects if r["stage"] == "input"}
    short_file = config.partition("demo_short").input
    assert "invalid JSON" in next(r for r in short_rejects if r["source_line"] == 11)["reason"]
    assert by_id["bad-no-messages"]["reason"].startswith(f"{short_file}:26: missing 'messages'")
    assert "unknown role 'wizard'" in by_id["bad-role"]["reason"]
    assert by_id["bad-role"]["source_line"] == 41
    [dup] = [r for r in short_rejects if r["reason_code"] == "duplicate_id"]
    assert dup["source_line"] == 64 and "already used on line 1" in dup["reason"]

    # The image partition: its two planted bad images rejected before any request, the others
    # sent with their images (scripts/make_demo_images.py; docs/images.md).
    images_dir = Path(config.output_dir) / "demo_images"
    image_rows = pq.read_table(sorted(images_dir.glob("part-*.parquet"))).to_pylist()
    assert len(image_rows) == 6 and all(r["images"] for r in image_rows)
    assert {len(r["images"]) for r in image_rows} == {1, 2}
    image_rejects = pq.read_table(sorted((images_dir / "rejects").glob("*.parquet"))).to_pylist()
    images_file = config.partition("demo_images").input
    reasons = {r["source_line"]: r["reason"] for r in image_rejects}
    missing = Path(images_file).parent / "images" / "missing.png"
    assert reasons[7] == (
        f"{images_file}:7: messages[0].content[1]: bad image: image not found: {missing}"
    )
    assert reasons[8].startswith(
        f"{images_file}:8: messages[0].content[1]: bad image: unreadable image"
    )
    assert {r["source_line"] for r in image_rejects} == {7, 8}
    assert manifest["partitions"]["demo_images"]["rejected"] == 2

    written = json.loads((Path(config.output_dir) / "manifest.json").read_text())
    assert written["status"] == "completed"
    fp = written["fingerprint"]
    assert (
        fp["content"]["chat_template_sha256"]
        == chat_tokenizer.fingerprint()["chat_template_sha256"]
    )
    assert fp["run"]["server_args"]["reasoning_parser"] is None

    # Too small to judge a draft by: eval refuses before it sends anything (the server URL
    # is never reached), naming the counts and the minimum, and writes nothing.
    capsys.readouterr()
    assert main(["eval", config.output_dir, "--server-url", "http://127.0.0.1:9"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "fewer than the minimum 50 (--min-records)" in err, err
    assert "moved to train as repeated prompts" in err
    assert not (Path(config.output_dir) / "split.json").exists()


def test_a_missing_input_fails_the_run_before_a_server_is_launched(tmp_path: Path) -> None:
    base = demo_config(tmp_path / "out")
    data = base.model_dump()
    data["partitions"][1]["input"] = str(tmp_path / "missing.jsonl")
    config = PipelineConfig.model_validate(data)
    ok, reason = run_pipeline(config)
    assert not ok
    assert f"{tmp_path}/missing.jsonl: input file not found for partition 'demo_long'" in str(
        reason
    )
    # Found before the server: none launched (no server log), nothing generated or written.
    out = Path(config.output_dir)
    assert not (out / "logs").exists() and not (out / "manifest.json").exists()
    assert not list(out.glob("*/part-*.parquet"))
