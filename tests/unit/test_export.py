"""Exports to SpecForge and speculators JSONL from a dataset written the pipeline's way."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import orjson
import pytest

from eagle3_datagen.errors import DatasetError
from eagle3_datagen.render.chat_tokenizer import ChatTokenizer
from eagle3_datagen.write.export import export_dataset
from eagle3_datagen_flows.cli import main
from tests.support.dataset import Batch, Tok, make_config, make_fingerprint, write_dataset


@pytest.fixture(scope="module")
def tk(chat_tokenizer: ChatTokenizer) -> Tok:
    return Tok(chat_tokenizer)


@pytest.fixture
def dataset(tmp_path: Path, tk: Tok, chat_tokenizer: ChatTokenizer) -> Path:
    root = tmp_path / "data"
    fp = make_fingerprint(make_config(), chat_tokenizer)
    write_dataset(root, fp, {
        "p1": [Batch([tk.record("a", "p1", line=1),
                      tk.record("b", "p1", tk.tool_output(), line=2)]),
               Batch([tk.record("c", "p1", tk.truncated_output(), finish="length", line=4)])],
        "p2": [Batch([tk.record("a", "p2", tk.output(think=9), line=7)])],
    })  # fmt: skip
    return root


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in path.read_bytes().splitlines()]


def test_specforge_rows_are_prompt_plus_output_with_loss_on_the_output(
    dataset: Path, tk: Tok, tmp_path: Path
) -> None:
    out = tmp_path / "sf.jsonl"
    result = export_dataset(dataset, "specforge", out)
    rows = read_jsonl(out)
    assert result.total == len(rows) == 4 and dict(result.written) == {"p1": 3, "p2": 1}
    expected_outputs = [tk.output(), tk.tool_output(), tk.truncated_output(), tk.output(think=9)]
    for row, output in zip(rows, expected_outputs, strict=True):
        assert set(row) == {"input_ids", "loss_mask"}
        assert row["input_ids"] == tk.prompt() + output
        assert row["loss_mask"] == [0] * len(tk.prompt()) + [1] * len(output)


def test_truncated_records_are_kept_unless_skipped(dataset: Path, tmp_path: Path) -> None:
    out = tmp_path / "sf.jsonl"
    result = export_dataset(dataset, "specforge", out, skip_truncated=True)
    assert result.total == len(read_jsonl(out)) == 3 and result.skipped_truncated == 1


def test_speculators_rows_have_its_fields_and_our_provenance(
    dataset: Path, tk: Tok, tmp_path: Path
) -> None:
    out = tmp_path / "spec.jsonl"
    export_dataset(dataset, "speculators", out)
    rows = {r["id"]: r for r in read_jsonl(out)}
    assert set(rows) == {"p1/a", "p1/b", "p1/c", "p2/a"}  # unique across partitions
    tool, cut, long = rows["p1/b"], rows["p1/c"], rows["p2/a"]
    assert set(tool) == {"id", "primary_id", "input_ids", "loss_mask", "metadata"}
    assert tool["primary_id"] == "b"
    assert tool["input_ids"] == tk.prompt() + tk.tool_output()
    assert sum(tool["loss_mask"]) == len(tk.tool_output())
    meta = tool["metadata"]
    assert meta["is_tool_call"] is True and rows["p1/a"]["metadata"]["is_tool_call"] is False
    assert meta["partition"] == "p1" and meta["idx"] == 1 and meta["source_line"] == 2
    assert meta["finish_reason"] == "stop" and meta["truncated"] is False
    assert meta["usage"] == {"prompt_tokens": 6, "completion_tokens": 11, "total_tokens": 17}
    assert meta["endpoint"] == "http://127.0.0.1:30000/generate"
    assert meta["sampling_params"]["max_new_tokens"] == 10240
    assert long["metadata"]["sampling_params"]["max_new_tokens"] == 16384
    assert cut["metadata"]["finish_reason"] == "length" and cut["metadata"]["truncated"] is True
    assert len(meta["content_sha256"]) == 64


def test_export_is_atomic_and_refuses_data_of_another_run(
    dataset: Path, tk: Tok, tmp_path: Path, chat_tokenizer: ChatTokenizer
) -> None:
    out = tmp_path / "sf.jsonl"
    out.write_text("previous export\n")
    other = tmp_path / "other"
    config = make_config().model_copy(update={"batch_size": 7})
    write_dataset(other, make_fingerprint(config, chat_tokenizer),
                  {"p2": [Batch([tk.record("z", "p2")])]})  # fmt: skip
    shutil.copy(other / "p2" / "part-00000.parquet", dataset / "p2" / "part-00000.parquet")
    with pytest.raises(DatasetError, match=r"p2/part-00000.parquet: made under fingerprint"):
        export_dataset(dataset, "specforge", out)
    assert out.read_text() == "previous export\n"
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_uncommitted_shards_are_left_out(dataset: Path, tmp_path: Path) -> None:
    shutil.copy(dataset / "p1" / "part-00000.parquet", dataset / "p1" / "part-00009.parquet")
    result = export_dataset(dataset, "specforge", tmp_path / "sf.jsonl")
    assert dict(result.written) == {"p1": 3, "p2": 1}


def test_cli_export(dataset: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "nested" / "spec.jsonl"
    argv = ["export", str(dataset), "--format", "speculators", "--output", str(out)]
    assert main([*argv, "--skip-truncated"]) == 0
    assert "exported 3 records (p1=2, p2=1), 1 truncated skipped" in capsys.readouterr().out
    assert len(read_jsonl(out)) == 3
    with pytest.raises(SystemExit):
        main(["export", str(dataset), "--format", "csv", "--output", str(out)])
