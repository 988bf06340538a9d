"""The data picture (length histograms, truncation and reject rates) and the dataset card,
from a dataset written the way the pipeline writes it; the card loads with ``datasets``."""

from __future__ import annotations

from pathlib import Path

import yaml

from eagle3_datagen.report.data_picture import Distribution, partition_picture, picture_markdown
from eagle3_datagen.report.dataset_card import CARD, refresh_dataset_card
from eagle3_datagen.write.manifest import read_manifest
from tests.support.dataset import Batch, Tok, make_config, make_fingerprint, reject, write_dataset


def test_histogram_bins_are_powers_of_two_with_counts() -> None:
    text = Distribution("x", [1, 2, 3, 300, 310, 700]).histogram()
    bins = {
        label.strip(): bar.split() for label, bar in (ln.split(" | ") for ln in text.splitlines())
    }
    assert list(bins) == [
        "1",
        "2-3",
        "4-7",
        "8-15",
        "16-31",
        "32-63",
        "64-127",
        "128-255",
        "256-511",
        "512-1023",
    ]
    assert bins["256-511"] == ["█" * 40, "2"] and bins["1"] == ["█" * 20, "1"]
    assert bins["16-31"] == ["0"]
    assert Distribution("x").histogram() == "(no records)"


def write_sample(root: Path, chat_tokenizer: object) -> None:
    config = make_config(("p1", "p2"))
    fp = make_fingerprint(config, chat_tokenizer)  # type: ignore[arg-type]
    t = Tok(chat_tokenizer)  # type: ignore[arg-type]
    p1 = [
        Batch(
            [
                t.record("a", "p1", t.output(think=30, answer=5), line=1),
                t.record("b", "p1", t.output(think=3, answer=2), line=2),
                t.record("c", "p1", t.truncated_output(50), finish="length", line=3),
            ],
            [reject("p1", 4)],
        )
    ]
    p2 = [Batch([t.record("d", "p2", line=1)])]
    write_dataset(root, fp, {"p1": p1, "p2": p2})


def test_picture_from_disk_and_a_card_that_datasets_loads(
    tmp_path: Path, chat_tokenizer: object
) -> None:
    write_sample(tmp_path, chat_tokenizer)
    pic = partition_picture(tmp_path, "p1")
    assert (pic.input_lines, pic.accepted, pic.rejected, pic.truncated) == (4, 3, 1, 1)
    assert sorted(pic.output.values) == [7, 37, 50]
    assert sorted(pic.thinking.values) == [3, 30]  # the truncated one never closed </think>
    assert pic.prompt.values == [6, 6, 6]
    md = picture_markdown(pic)
    assert "reject rate 25.0%: bad_input 1" in md and "truncation rate 33.3% of accepted" in md
    assert "**output length (tokens)**" in md and "32-63 |" in md

    manifest = read_manifest(tmp_path)
    assert manifest is not None
    assert sorted(refresh_dataset_card(tmp_path, manifest)) == ["p1", "p2"]
    text = (tmp_path / CARD).read_text()
    front = yaml.safe_load(text.split("---\n")[1])
    assert front["configs"][0] == {
        "config_name": "p1",
        "default": True,
        "data_files": [{"split": "train", "path": "p1/part-*.parquet"}],
    }
    assert manifest["fingerprint"]["content_sha256"] in text
    assert "## How to load" in text and "## Provenance" in text and "32-63 |" in text

    import datasets

    default = datasets.load_dataset(str(tmp_path), split="train")
    assert sorted(default["id"]) == ["a", "b", "c"]
    p2 = datasets.load_dataset(str(tmp_path), "p2", split="train")
    assert p2["id"] == ["d"] and p2[0]["output_ids"] == Tok(chat_tokenizer).output()  # type: ignore[arg-type]
