"""Our exports against what speculators 0.9.0 and SpecForge 0.2.0's own code made of them.

``trainers/run.sh --record`` ran each trainer's loader, split and EAGLE-3 shift on exports of
two datasets (the demo, and one with several rows per conversation and truncated records)
and recorded the result in tests/fixtures/trainers/ together with the datasets. Here the
current export code exports the same datasets again with the recorded options, and every
recorded fact must hold for it: the trainer loaded every record with the ids and mask we
write now; after its shift it trains the model's output positions plus the first proposal
(derived from the dataset's own prompt and output lengths, not from the export); its split is
ours and keeps conversations whole; what it would clip, the report counted. Image records
(the demo's ``demo_images``) are left out of both exports by design (docs/exports.md): neither
trainer saw them, and the metadata lists exactly them. No torch here.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections import Counter
from pathlib import Path
from typing import Any

import orjson
import pyarrow.parquet as pq
import pytest

from eagle3_datagen.demo import TOKENIZER_DIR
from eagle3_datagen.write.export import ExportOptions, export_dataset
from eagle3_datagen.write.export_report import length_summary

FIXTURES = Path(
    os.environ.get("TRAINER_FIXTURES") or Path(__file__).parents[1] / "fixtures" / "trainers"
)
DATASETS = ("demo", "grouped")
OPTION_KEYS = ("truncated", "over_length", "max_length", "validation", "split_seed")


def sha(values: list[int]) -> str:
    return hashlib.sha256(json.dumps(values).encode()).hexdigest()


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in path.read_bytes().splitlines()] if path.exists() else []


def dataset_records(root: Path) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """partition/id -> prompt length, length, conversation, truncated, sha of the ids, for
    every record the exports hold; and the ids of the image records, which they leave out."""
    out: dict[str, dict[str, Any]] = {}
    images: list[str] = []
    for shard in sorted(root.glob("*/part-*.parquet")):
        columns = ["id", "conversation_id", "prompt_ids", "output_ids", "truncated"]
        if "images" in pq.read_schema(shard).names:
            columns.append("images")
        for r in pq.read_table(shard, columns=columns).to_pylist():
            if r.get("images"):
                images.append(f"{shard.parent.name}/{r['id']}")
                continue
            ids = r["prompt_ids"] + r["output_ids"]
            out[f"{shard.parent.name}/{r['id']}"] = {
                "prompt": len(r["prompt_ids"]),
                "length": len(ids),
                "sha256": sha(ids),
                "conversation": f"{shard.parent.name}/{r['conversation_id'] or r['id']}",
                "truncated": r["truncated"],
            }
    return out, images


class Case:
    """One recorded dataset, exported again now in both formats with the recorded options."""

    def __init__(self, name: str, tmp: Path) -> None:
        base = FIXTURES / name
        self.root = base / "dataset"
        self.data, self.image_ids = dataset_records(self.root)
        # Records can repeat each other's ids exactly (the demo's emulator answers a repeated
        # prompt the same way): what the trainers loaded is compared as a multiset.
        self.by_sha: dict[str, list[str]] = {}
        for key, rec in self.data.items():
            self.by_sha.setdefault(rec["sha256"], []).append(key)
        self.recorded = {f: json.loads((base / f"{f}.json").read_text()) for f in FORMATS}
        self.meta: dict[str, dict[str, Any]] = {}
        self.rows: dict[str, dict[str, list[dict[str, Any]]]] = {}
        for fmt in FORMATS:
            old = json.loads((base / f"{fmt}.export.json").read_text())["options"]
            out = tmp / fmt / f"{fmt}.jsonl"
            options = ExportOptions(**{k: old[k] for k in OPTION_KEYS})
            result = export_dataset(
                self.root, fmt, out, options=options, tokenizer=str(TOKENIZER_DIR)
            )
            self.meta[fmt] = result.metadata
            val = out.with_name(f"{fmt}.validation.jsonl")
            self.rows[fmt] = {"train": read_jsonl(out), "validation": read_jsonl(val)}

    def expected_trained(self, sha256: str, max_length: int) -> list[list[int]]:
        """Output positions plus the first proposal: every output token as the draft's input
        predicting the next, the first (token P+1) from the last prompt token's features,
        through the distribution after the last token (index L), clipped at the maximum."""
        expected = {
            (self.data[k]["prompt"] + 1, min(self.data[k]["length"], max_length))
            for k in self.by_sha[sha256]
        }
        assert len(expected) == 1, f"records with the same ids but another prompt: {expected}"
        return [list(expected.pop())]


FORMATS = ("speculators", "specforge")


@pytest.fixture(scope="module", params=DATASETS)
def case(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Case:
    assert (FIXTURES / request.param / "dataset" / "manifest.json").exists(), (
        f"{FIXTURES / request.param}: no recorded trainer outputs; run trainers/run.sh --record"
    )
    return Case(request.param, tmp_path_factory.mktemp(request.param))


def test_speculators_loaded_every_record_with_our_ids_and_mask(case: Case) -> None:
    recorded = case.recorded["speculators"]["records"]
    ours = {r["id"]: (side, r) for side, rows in case.rows["speculators"].items() for r in rows}
    assert set(recorded) == set(ours) == set(case.data)
    for rid, rec in recorded.items():
        side, row = ours[rid]
        assert rec["sha256"] == sha(row["input_ids"]) == case.data[rid]["sha256"], rid
        assert rec["mask_sha256"] == sha(row["loss_mask"]), rid
        assert rec["exported_to"] == side, rid
    # prepare-data passed every row through identical, from the file we wrote it to.
    loaded = Counter((rec["sha256"], rec["loaded_from"]) for rec in recorded.values())
    assert loaded == Counter((rec["sha256"], rec["exported_to"]) for rec in recorded.values())


def test_specforge_loaded_every_record_with_our_ids_and_mask(case: Case) -> None:
    recorded = case.recorded["specforge"]["records"]
    ours = {
        f"specforge{'.validation' if side == 'validation' else ''}.jsonl:{i}": r
        for side, rows in case.rows["specforge"].items()
        for i, r in enumerate(rows, start=1)
    }
    assert set(recorded) == set(ours)
    assert Counter(rec["sha256"] for rec in recorded.values()) == Counter(
        rec["sha256"] for rec in case.data.values()
    )
    for line, rec in recorded.items():
        assert rec["loaded_identical"], f"{line}: SpecForge's prompt loader changed the row"
        row = ours[line]
        assert rec["sha256"] == sha(row["input_ids"]), line
        assert rec["mask_sha256"] == sha(row["loss_mask"]), line


@pytest.mark.parametrize("fmt", FORMATS)
def test_trained_positions_are_the_outputs_plus_the_first_proposal(case: Case, fmt: str) -> None:
    """speculators' shift_batch and SpecForge's offline shift, run on our rows."""
    recorded = case.recorded[fmt]
    max_length = recorded["max_length"]
    for key, rec in recorded["records"].items():
        assert rec["trained"] == case.expected_trained(rec["sha256"], max_length), key


def test_specforge_without_the_last_prompt_token_loses_the_first_proposal(case: Case) -> None:
    """What SpecForge's shift made of the export before (loss only on the output): one
    prediction per record fewer, always the draft's first after prefill."""
    recorded = case.recorded["specforge"]
    for key, trained in recorded["output_only_mask_trained"].items():
        sha256 = recorded["records"][key]["sha256"]
        first, last = case.expected_trained(sha256, recorded["max_length"])[0]
        assert trained == [[first + 1, last]], key


def test_validation_split_keeps_conversations_whole(case: Case) -> None:
    """speculators' own ArrowDataset split (joined train-first, the printed ratio) and
    SpecForge's two feature directories hold exactly our sides, and our sides keep every
    conversation whole."""
    recorded = case.recorded["speculators"]["records"]
    ours = Counter((rec["sha256"], rec["exported_to"]) for rec in recorded.values())
    assert Counter((rec["sha256"], rec["split"]) for rec in recorded.values()) == ours
    sf = case.recorded["specforge"]["records"].values()
    assert Counter((rec["sha256"], rec["file"]) for rec in sf) == ours
    sides: dict[str, set[str]] = {"train": set(), "validation": set()}
    for rid, rec in recorded.items():
        sides[rec["exported_to"]].add(case.data[rid]["conversation"])
    assert sides["train"] and sides["validation"]
    assert not sides["train"] & sides["validation"]


@pytest.mark.parametrize("fmt", FORMATS)
def test_clipping_is_what_the_report_counts(case: Case, fmt: str) -> None:
    """Each trainer's own loader clipped exactly the records our report counts: none at the
    export's max length, and as many as length_summary says at a low one."""
    recorded = case.recorded[fmt]
    assert recorded["clipped"] == case.meta[fmt]["lengths"]["over_max_length"]
    low = recorded["clipped_at_low_max"]
    lengths = [rec["length"] for rec in case.data.values()]
    assert low["rows"] == length_summary(lengths, low["max_length"])["over_max_length"]
    if case.root.parent.name == "demo":
        assert low["rows"] > 0  # the low maximum does clip some demo records


def test_image_records_are_left_out_of_both_exports_and_listed(case: Case) -> None:
    """Neither trainer saw an image record (the loaded-every-record tests compare against
    ``case.data``, which holds none); our metadata counts and lists exactly them."""
    for fmt in FORMATS:
        meta = case.meta[fmt]
        assert sorted(meta["image_ids"]) == sorted(case.image_ids)
        assert meta["counts"]["images_left_out"] == len(case.image_ids)
        exported = sum(len(rows) for rows in case.rows[fmt].values())
        assert exported == len(case.data) == meta["lengths"]["records"]
    if case.root.parent.name == "demo":
        assert case.image_ids  # the demo has an image partition


def test_truncated_records_are_in_our_metadata_as_the_trainers_drop_the_flag(case: Case) -> None:
    """speculators' prepare-data keeps only the ids and mask; SpecForge's rows have no field."""
    assert case.recorded["speculators"]["prepared_columns"] == ["input_ids", "loss_mask", "seq_len"]
    truncated = sorted(k for k, rec in case.data.items() if rec["truncated"])
    for fmt in FORMATS:
        meta = case.meta[fmt]
        assert sorted(meta["truncated_ids"]) == truncated
        assert meta["counts"]["truncated"] == len(truncated) and meta["options"]["truncated"]
    if case.root.parent.name == "grouped":
        assert truncated  # the grouped dataset's LONG tier is cut short


def test_both_trainers_trained_at_least_30_steps_and_the_loss_fell() -> None:
    training = json.loads((FIXTURES / "training.json").read_text())
    spec, sf = training["speculators"], training["specforge"]
    assert spec["steps"] >= 30 and sf["steps"] >= 30
    assert spec["last5"] < spec["first5"] and sf["last_third"] < sf["first_third"]
