"""The export's report and metadata count the rows it wrote: checked against the rows read back
from the JSONL and the dataset's records read back with pyarrow, on a dataset with image records
(left out of both formats by design) and records left out by the options."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import orjson
import pyarrow.parquet as pq
import pytest

from eagle3_datagen.render.chat_tokenizer import ChatTokenizer
from eagle3_datagen.write.export import ExportOptions, export_dataset
from tests.support.dataset import Batch, Tok, make_config, make_fingerprint, write_dataset

MAX = 16  # prompts are 6 tokens: outputs of 11 and 13 tokens make records of 17 and 19
IMAGE = {"ref": "images/a.png", "sha256": "0" * 64, "width": 8, "height": 8, "format": "PNG"}


@pytest.fixture
def dataset(tmp_path: Path, chat_tokenizer: ChatTokenizer) -> Path:
    """Text records of 12, 13, 17 and 19 tokens (one truncated, 17); image records of 12 and
    21 tokens (the longest record of all, so it would change every length count)."""
    tk = Tok(chat_tokenizer)
    root = tmp_path / "data"
    image = {**IMAGE, "tokens": 1}
    text = [
        tk.record("a", "p1", tk.truncated_output(6), line=1),
        tk.record("b", "p1", tk.truncated_output(7), line=2),
        tk.record("c", "p1", tk.truncated_output(11), finish="length", line=3),
        tk.record("d", "p1", tk.truncated_output(13), line=4),
    ]
    for i, rec in enumerate(text):  # one prompt each, of the same length: none repeats
        rec.prompt_ids = [20 + i, *rec.prompt_ids[1:]]
    images = [
        tk.record("i1", "imgs", tk.truncated_output(6), line=1, images=[image]),
        tk.record("i2", "imgs", tk.truncated_output(15), line=2, images=[image]),
    ]
    fp = make_fingerprint(make_config(), chat_tokenizer)
    write_dataset(root, fp, {"p1": [Batch(text)], "imgs": [Batch(images)]})
    return root


def read_back(out: Path) -> list[dict[str, Any]]:
    files = [out, out.with_name(f"{out.stem}.validation{out.suffix}")]
    return [orjson.loads(x) for f in files if f.exists() for x in f.read_bytes().splitlines()]


def image_ids(root: Path) -> list[str]:
    """The dataset's image records, read with pyarrow."""
    ids = []
    for shard in sorted(root.glob("*/part-*.parquet")):
        for r in pq.read_table(shard, columns=["id", "images"]).to_pylist():
            if r["images"]:
                ids.append(f"{shard.parent.name}/{r['id']}")
    return ids


@pytest.mark.parametrize("fmt", ["speculators", "specforge"])
def test_kept_rows_are_what_the_report_counts(dataset: Path, tmp_path: Path, fmt: str) -> None:
    out = tmp_path / "out" / f"{fmt}.jsonl"
    result = export_dataset(dataset, fmt, out, options=ExportOptions(max_length=MAX))
    rows = read_back(out)
    lengths = sorted(len(r["input_ids"]) for r in rows)
    assert lengths == [12, 13, 17, 19]
    meta = json.loads(result.metadata_path.read_text())  # type: ignore[union-attr]
    assert meta == result.metadata
    summary = meta["lengths"]
    assert summary["records"] == len(rows) == meta["counts"]["exported"] == result.total
    assert summary["max"] == max(lengths) and summary["tokens"] == sum(lengths)
    assert summary["over_max_length"] == sum(1 for n in lengths if n > MAX) == 2
    assert summary["tokens_past_max_length"] == sum(n - MAX for n in lengths if n > MAX) == 4
    assert meta["image_ids"] == image_ids(dataset) == ["imgs/i1", "imgs/i2"]
    counts = meta["counts"]
    assert (counts["records"], counts["images_left_out"], counts["truncated"]) == (6, 2, 1)
    report = (tmp_path / "out" / f"{fmt}.report.txt").read_text()
    assert f"lengths (prompt + output tokens) of {len(rows)} records (the exported rows)" in report
    assert "2 records WILL BE CLIPPED by the trainer (4 tokens past the maximum)" in report
    assert "left out of the dataset's 6 records: 2 image records (by design" in report
    assert "2 image records are left out: these exports are token ids only" in report


def test_dropped_rows_are_counted_apart_from_the_image_records(
    dataset: Path, tmp_path: Path
) -> None:
    """--truncated drop and --over-length drop: the counts add up to the dataset's records,
    and the over-length ones are those the length check saw, not the image records."""
    out = tmp_path / "sf.jsonl"
    options = ExportOptions(max_length=MAX, truncated="drop", over_length="drop")
    result = export_dataset(dataset, "specforge", out, options=options)
    rows = read_back(out)
    assert sorted(len(r["input_ids"]) for r in rows) == [12, 13]
    counts, summary = result.metadata["counts"], result.metadata["lengths"]
    assert counts["exported"] == len(rows) == result.total
    assert (counts["truncated_dropped"], counts["over_length_dropped"]) == (1, 1)
    assert result.metadata["over_length_ids"] == ["p1/d"]  # c (17) was dropped as truncated
    assert counts["records"] == len(rows) + 2 + 1 + 1 == 6
    assert (summary["records"], summary["over_max_length"], summary["max"]) == (3, 1, 19)
    report = "\n".join(result.report())
    assert (
        "left out of the dataset's 6 records: 2 image records (by design, see below), "
        "1 truncated (--truncated drop), 1 longer than the max length (--over-length drop)"
    ) in report
    assert "1 records left out (--over-length drop) (3 tokens past the maximum)" in report


def test_paths_are_relative_to_the_exports_directory(dataset: Path, tmp_path: Path) -> None:
    """A user reading the metadata beside the export finds the files and the dataset from
    there, wherever the two directories are moved together."""
    out = tmp_path / "exports" / "v1" / "spec.jsonl"
    options = ExportOptions(validation=0.5)
    result = export_dataset(dataset, "speculators", out, options=options)
    meta = result.metadata
    assert meta["dataset"]["path"] == "../../data"
    assert (out.parent / meta["dataset"]["path"]).resolve() == dataset.resolve()
    assert meta["files"] == {"train": "spec.jsonl", "validation": "spec.validation.jsonl"}
    assert all((out.parent / name).exists() for name in meta["files"].values())
    assert "speculators prepare-data --data spec.jsonl --seq-length 8192" in meta["settings"][0]
    for text in (result.metadata_path.read_text(), result.report_path.read_text()):  # type: ignore[union-attr]
        assert str(tmp_path) not in text
