"""``eagle3-datagen select`` on datasets the pipeline's own code made against a real emulator
process (a speculating server, logprobs top_k=5, two samples per line): the new dataset keeps
whole conversations ranked by the rule, says where it came from, validates, exports, and a
rerun is idempotent; a rule without its column names the option that makes it."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import orjson
import pytest

from eagle3_datagen.errors import DatasetError
from eagle3_datagen.inputs.scan import scan_input
from eagle3_datagen.provenance import build_fingerprint, parquet_metadata
from eagle3_datagen.render.chat_tokenizer import ChatTokenizer
from eagle3_datagen.select.choose import keep_count
from eagle3_datagen.select.output import select_dataset
from eagle3_datagen.validate.dataset import validate_dataset
from eagle3_datagen.write.export import ExportOptions, export_dataset
from eagle3_datagen.write.manifest import summarize_on_disk, update_manifest
from eagle3_datagen.write.resume import record_input
from eagle3_datagen.write.shards import PartitionOutput
from eagle3_datagen_cli.main import main
from tests.integration.test_logprob_records import logprob_config
from tests.support import TOKENIZER_DIR
from tests.support.pipeline import records, run_batches

SPECULATING = (
    "--speculative-algorithm", "EAGLE3", "--speculative-num-steps", "3",
    "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4",
    "--emu-accept-length", "2.5", "--emu-mean-output-tokens", "60", "--random-seed", "0",
)  # fmt: skip


async def _dataset(root: Path, emu: Any, logprobs: dict[str, Any] | None, samples: int = 2) -> Path:
    """A finished dataset as the pipeline writes one: shards under the run's fingerprint, then
    the manifest from the commit markers."""
    config = logprob_config(root, logprobs, lines=16, samples=samples)
    info = emu.client.get("/server_info").json()
    fingerprint = build_fingerprint(config, ChatTokenizer(str(TOKENIZER_DIR)), info, "0.5.23")
    await run_batches(config, emu.url, metadata=parquet_metadata(fingerprint))
    out = Path(config.output_dir)
    scan = scan_input("p", config.partition("p").input, config.batch_size)
    record_input(PartitionOutput(out, "p"), scan.info)  # what the flow records for the manifest
    update_manifest(out, fingerprint, {"p": {**summarize_on_disk(out, "p"), "status": "completed"}})
    return out


def _by_conversation(rows: dict[str, dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    groups: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for row in rows.values():
        groups[row["conversation_id"]].append(row)
    return groups


def _flatness(rows: list[dict[str, Any]]) -> float:
    n = sum(len(r["output_ids"]) for r in rows)
    return sum(r["entropy_mean"] * len(r["output_ids"]) for r in rows) / n


async def test_select_keeps_whole_conversations_by_the_rule(
    tmp_path: Path, emulator_factory: Any
) -> None:
    draft = tmp_path / "draft"
    draft.mkdir()
    emu = emulator_factory(*SPECULATING, "--speculative-draft-model-path", str(draft))
    source = await _dataset(tmp_path / "src", emu.wait_ready(), {"top_k": 5})
    src_rows = records(source, "p")
    assert validate_dataset(source).ok  # the logprob columns pass the offline checks too
    # Two rows per input line (two samples) are the line's, not a line twice.
    with_inputs = validate_dataset(source, inputs=True)
    assert with_inputs.ok, with_inputs.lines()
    groups = _by_conversation(src_rows)
    assert len(groups) == 16 and all(len(g) == 2 for g in groups.values())  # two samples

    # The first export fixes the source's held-out split (a quarter, for this small source).
    first = ExportOptions(validation=0.25)
    export_dataset(source, "specforge", tmp_path / "first.jsonl", options=first)
    split = json.loads((source / "split.json").read_text())
    held = {c for _, c in split["held_out"]}
    assert 0 < len(held) < 16
    out = tmp_path / "flat"
    outcome = select_dataset(source, out, "flatness", 0.25, seed=3)
    kept = _by_conversation(records(out, "p"))
    # The rule ranks the training conversations only; every held-out one is copied, unranked.
    ranked = outcome.partitions["p"].kept
    assert len(ranked) == keep_count(0.25, 16 - len(held)) and not ranked & held
    assert set(kept) == ranked | held
    assert json.loads((out / "split.json").read_text()) == split
    for conv, rows in kept.items():  # whole, and byte for byte the source's records
        assert sorted(r["id"] for r in rows) == sorted(r["id"] for r in groups[conv])
        assert all(r == src_rows[r["id"]] for r in rows)
    lowest_kept = min(_flatness(groups[c]) for c in ranked)
    assert all(_flatness(g) <= lowest_kept for c, g in groups.items() if c not in kept)

    manifest = json.loads((out / "manifest.json").read_text())
    selection = manifest["selection"]
    assert selection["source"] == str(source.resolve())
    assert (
        selection["source_content_sha256"]
        == json.loads((source / "manifest.json").read_text())["fingerprint"]["content_sha256"]
    )
    assert (selection["rule"], selection["keep"], selection["seed"]) == ("flatness", 0.25, 3)
    assert manifest["partitions"]["p"]["accepted"] == 2 * len(kept)

    card = (out / "README.md").read_text()
    assert f"| selected from (eagle3-datagen select) | `{source.resolve()} (content" in card
    assert "rule flatness, keep 0.25 of each partition's conversations, seed 3" in card

    report = validate_dataset(out)
    assert report.ok, report.lines()
    # An export of the selection holds out exactly the source's held-out conversations.
    result = export_dataset(out, "specforge", tmp_path / "flat.jsonl")
    written = {"train": 2 * len(ranked), "validation": 2 * len(held)}
    assert result.metadata["counts"]["written"] == written
    assert len((tmp_path / "flat.jsonl").read_text().splitlines()) == 2 * len(ranked)

    # The same request again: nothing rewritten. Another one into the same place: refused.
    before = {p: p.stat().st_mtime_ns for p in out.rglob("*.parquet")}
    assert select_dataset(source, out, "flatness", 0.25, seed=3).already_done
    assert {p: p.stat().st_mtime_ns for p in out.rglob("*.parquet")} == before
    # A run killed before its manifest, one batch unwritten: the same command finishes it.
    kept_rows = records(out, "p")
    (out / "manifest.json").unlink()
    (out / "p" / "_batches" / "00001.json").unlink()
    (out / "p" / "part-00001.parquet").unlink()
    again = select_dataset(source, out, "flatness", 0.25, seed=3)
    assert not again.already_done and records(out, "p") == kept_rows
    assert (out / "p" / "part-00000.parquet").stat().st_mtime_ns == before[
        out / "p" / "part-00000.parquet"
    ]  # a committed batch is left as it was
    assert validate_dataset(out).ok
    with pytest.raises(DatasetError, match=r"another selection \(rule: 'flatness' -> 'random'"):
        select_dataset(source, out, "random", 0.25, seed=3)

    # acceptance: the lowest accept lengths; deviation from the acceptance columns.
    low = select_dataset(source, tmp_path / "low", "acceptance", 0.5)
    accept = {
        c: sum(len(r["output_ids"]) for r in g) / sum(r["spec_verify_ct"] for r in g)
        for c, g in groups.items()
    }
    assert max(accept[c] for c in low.partitions["p"].kept) <= min(
        accept[c] for c in groups if c not in low.partitions["p"].kept | held
    )
    dev = select_dataset(source, tmp_path / "dev", "deviation", 0.5)
    assert dev.request.params == {"source": "acceptance"}
    assert validate_dataset(tmp_path / "dev").ok


async def test_a_rule_without_its_column_names_the_option(
    tmp_path: Path, emulator_factory: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    emu = emulator_factory("--random-seed", "0", "--emu-mean-output-tokens", "30").wait_ready()
    source = await _dataset(tmp_path / "src", emu, None, samples=1)
    for rule, option in [
        ("flatness", "logprobs: {top_k: K}"),
        ("acceptance", "server.speculative"),
        ("deviation", "server.speculative"),
    ]:
        code = main(["select", str(source), "--by", rule, "--keep", "0.5", "--output",
                     str(tmp_path / rule)])  # fmt: skip
        assert code == 2
        err = capsys.readouterr().err
        assert option in err, err
        assert not (tmp_path / rule).exists()  # refused before anything is written
    # random needs nothing; the CLI says what it kept, and twice is idempotent.
    args = ["select", str(source), "--by", "random", "--keep", "0.5", "--output",
            str(tmp_path / "rnd"), "--seed", "1"]  # fmt: skip
    assert main(args) == 0
    # The first select fixed the source's split (the default fraction); its held-out
    # conversations are copied, not ranked.
    h = len(orjson.loads((source / "split.json").read_bytes())["held_out"])
    out = capsys.readouterr().out
    assert f"p: kept {keep_count(0.5, 16 - h)} of {16 - h} training conversations" in out, out
    assert f"{h} held-out conversations copied as they are" in out
    assert main(args) == 0
    assert "already selected by random" in capsys.readouterr().out
    manifest = orjson.loads((tmp_path / "rnd" / "manifest.json").read_bytes())
    assert manifest["selection"]["seed"] == 1
    assert validate_dataset(tmp_path / "rnd").ok
    # Against its input files too: the lines a selection dropped are not missing lines.
    assert validate_dataset(source, inputs=True).ok
    with_inputs = validate_dataset(tmp_path / "rnd", inputs=True)
    assert with_inputs.ok, with_inputs.lines()
