"""Offline validation of a dataset written the pipeline's way, with records planted to fail."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest

from eagle3_datagen.errors import DatasetError
from eagle3_datagen.render.chat_tokenizer import ChatTokenizer
from eagle3_datagen.validate.dataset import AuditReport, validate_dataset
from eagle3_datagen_cli.main import main
from tests.support.dataset import (
    TOKENIZER_DIR,
    Batch,
    Tok,
    make_config,
    make_fingerprint,
    reject,
    write_dataset,
)


@pytest.fixture(scope="module")
def tk(chat_tokenizer: ChatTokenizer) -> Tok:
    return Tok(chat_tokenizer)


@pytest.fixture(scope="module")
def fp(chat_tokenizer: ChatTokenizer) -> dict[str, Any]:
    return make_fingerprint(make_config(), chat_tokenizer)


def good(tk: Tok) -> dict[str, list[Batch]]:
    return {
        "p1": [
            Batch(
                [tk.record("a", "p1", line=1), tk.record("b", "p1", tk.tool_output(), line=2)],
                [reject("p1", 3)],
            ),
            Batch(
                [
                    tk.record("c", "p1", tk.output(think=7, answer=4), line=4),
                    tk.record("d", "p1", tk.truncated_output(), finish="length", line=5),
                ]
            ),
        ],
        "p2": [Batch([tk.record("a", "p2")])],  # an id of p1 again: unique per partition only
    }


def part(report: AuditReport, name: str) -> Any:
    return next(p for p in report.partitions if p.partition == name)


def test_a_valid_dataset_passes_with_the_manifests_own_numbers(
    tmp_path: Path, tk: Tok, fp: dict[str, Any]
) -> None:
    manifest = write_dataset(tmp_path, fp, good(tk))
    report = validate_dataset(tmp_path)
    assert report.ok, "\n".join(report.lines())
    assert report.records == 5 and report.invalid == 0
    p1 = part(report, "p1").summary
    for key in (
        "accepted",
        "rejected",
        "rejects_by_reason",
        "truncated",
        "truncation_rate",
        "prompt_tokens",
        "output_tokens",
        "output_length",
        "thinking_length",
    ):
        assert p1[key] == manifest["partitions"]["p1"][key], key
    assert p1["truncation_rate"] == 0.25
    assert p1["thinking_length"]["max"] == 7
    assert report.lines()[-1].startswith("OK: 5 records")


def test_invalid_records_are_counted_by_reason_and_named(
    tmp_path: Path, tk: Tok, fp: dict[str, Any]
) -> None:
    i = tk.id
    bad = [
        tk.record("never-closed", "p1", [100, 101, i["<|im_end|>"]]),
        tk.record("role-leak", "p1", [100, i["</think>"], 200, i["<|im_user|>"], i["<|im_end|>"]]),
        tk.record("miscounted", "p1", completion_tokens=99),
        tk.record("flag", "p1", truncated=True),
        tk.record("a", "p1"),  # already in the first batch
    ]
    parts = good(tk)
    parts["p1"].append(Batch(bad))
    write_dataset(tmp_path, fp, parts)
    report = validate_dataset(tmp_path)
    p1 = part(report, "p1")
    assert not report.ok and report.invalid == 5 == p1.invalid
    assert dict(p1.invalid_by_reason) == {
        "think_end_count": 1,
        "role_token_in_output": 1,
        "completion_token_mismatch": 1,
        "truncated_flag": 1,
        "duplicate_id": 1,
    }
    shard = str(tmp_path / "p1" / "part-00002.parquet")
    assert all(e.startswith(f"{shard}: row ") for e in p1.examples)
    assert any("(id 'role-leak'" in e and "role/turn token" in e for e in p1.examples)
    assert part(report, "p2").invalid == 0
    assert report.lines()[-1].startswith("FAILED: 10 records, 5 invalid")


def test_the_rules_are_the_ones_recorded_in_the_manifest(
    tmp_path: Path, tk: Tok, chat_tokenizer: ChatTokenizer
) -> None:
    strict = make_fingerprint(make_config(truncation="reject"), chat_tokenizer)
    write_dataset(tmp_path, strict, good(tk))
    report = validate_dataset(tmp_path)
    assert dict(part(report, "p1").invalid_by_reason) == {"truncated": 1}


def _another_runs_shard(root: Path, other: Path) -> str:
    shutil.copy(other / "p1" / "part-00001.parquet", root / "p1" / "part-00001.parquet")
    return "data of another run is mixed in"


def _lost_rejects(root: Path, other: Path) -> str:
    (root / "p1" / "rejects" / "part-00000.parquet").unlink()
    return "manifest says rejected=1, the files hold 0"


def _uncommitted_shard(root: Path, other: Path) -> str:
    shutil.copy(root / "p1" / "part-00000.parquet", root / "p1" / "part-00007.parquet")
    return "part-00007.parquet: uncommitted shard"


def _manifest_count(root: Path, other: Path) -> str:
    manifest = json.loads((root / "manifest.json").read_text())
    manifest["partitions"]["p2"]["accepted"] = 2
    (root / "manifest.json").write_text(json.dumps(manifest))
    return "partition 'p2': manifest says accepted=2, the files hold 1"


@pytest.mark.parametrize(
    "tamper", [_another_runs_shard, _lost_rejects, _uncommitted_shard, _manifest_count]
)
def test_a_dataset_that_does_not_hold_together_fails(
    tmp_path: Path,
    tk: Tok,
    fp: dict[str, Any],
    chat_tokenizer: ChatTokenizer,
    tamper: Callable[[Path, Path], str],
) -> None:
    root, other = tmp_path / "root", tmp_path / "other"
    write_dataset(root, fp, good(tk))
    config = make_config().model_copy(update={"batch_size": 7})  # another fingerprint
    write_dataset(other, make_fingerprint(config, chat_tokenizer), good(tk))
    expected = tamper(root, other)
    report = validate_dataset(root)
    assert not report.ok and report.invalid == 0
    assert any(expected in problem for problem in report.all_problems), report.all_problems


def test_a_moved_tokenizer_is_given_on_the_command_line(
    tmp_path: Path, tk: Tok, fp: dict[str, Any]
) -> None:
    moved = orjson.loads(orjson.dumps(fp))
    moved["run"]["tokenizer_path"] = str(tmp_path / "gone")
    write_dataset(tmp_path, moved, good(tk))
    with pytest.raises(DatasetError, match="pass --tokenizer"):
        validate_dataset(tmp_path)
    assert validate_dataset(tmp_path, tokenizer=str(TOKENIZER_DIR)).ok


def test_a_tokenizer_with_another_vocabulary_is_refused(
    tmp_path: Path, tk: Tok, fp: dict[str, Any]
) -> None:
    other = orjson.loads(orjson.dumps(fp))
    other["content"]["tokenizer"]["vocab_sha256"] = "0" * 64
    write_dataset(tmp_path, other, good(tk))
    with pytest.raises(DatasetError, match="vocab_sha256 differ"):
        validate_dataset(tmp_path)


def test_cli_validate_exit_status(
    tmp_path: Path, tk: Tok, fp: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    write_dataset(tmp_path / "good", fp, good(tk))
    assert main(["validate", str(tmp_path / "good")]) == 0
    assert "p1: 4 records, 0 invalid, 1 rejected (bad_input=1)" in capsys.readouterr().out

    parts = good(tk)
    parts["p2"].append(Batch([tk.record("e", "p2", [100, tk.id["<|im_end|>"]])]))
    write_dataset(tmp_path / "bad", fp, parts)
    assert main(["validate", str(tmp_path / "bad"), "--json"]) == 1
    data = json.loads(capsys.readouterr().out)
    assert data["ok"] is False
    assert data["partitions"]["p2"]["invalid_by_reason"] == {"think_end_count": 1}

    assert main(["validate", str(tmp_path / "nothing")]) == 2
    assert f"{tmp_path / 'nothing' / 'manifest.json'}: no manifest" in capsys.readouterr().err


def test_spec_fields_that_disagree_with_the_output_are_invalid(
    tmp_path: Path, tk: Tok, fp: dict[str, Any]
) -> None:
    out = tk.output()  # several tokens: one from prefill, the rest from 2 verify steps
    spec: dict[str, Any] = {
        "spec_verify_ct": 2,
        "spec_num_correct_drafts": 1,
        "spec_num_proposed_drafts": 6,
        "spec_accept_length": len(out) / 2,
        "spec_accept_rate": 1 / 6,
        "spec_correct_drafts_histogram": [1, 1],
    }
    parts = good(tk)
    parts["p1"].append(
        Batch(
            [
                tk.record("spec-ok", "p1", out, line=7, **spec),
                tk.record("spec-bad", "p1", out, line=8, **{**spec, "spec_verify_ct": 3}),
            ]
        )
    )
    write_dataset(tmp_path, fp, parts)
    p1 = part(validate_dataset(tmp_path), "p1")
    assert dict(p1.invalid_by_reason) == {"spec_fields": 1}
    assert any("(id 'spec-bad'" in e for e in p1.examples)


def test_a_dataset_written_before_the_spec_columns_validates(
    tmp_path: Path, tk: Tok, fp: dict[str, Any]
) -> None:
    import pyarrow.parquet as pq

    from eagle3_datagen.write.records import SPEC_COLUMNS

    write_dataset(tmp_path, fp, good(tk))
    for path in tmp_path.glob("p*/part-*.parquet"):
        table = pq.read_table(path)
        old = table.drop_columns([*SPEC_COLUMNS, "has_tools"])
        pq.write_table(old.replace_schema_metadata(table.schema.metadata), path)
    report = validate_dataset(tmp_path)
    assert report.ok, "\n".join(report.lines())
    assert report.records == 5


def test_logprob_columns_that_break_the_rules_are_invalid(
    tmp_path: Path, tk: Tok, fp: dict[str, Any]
) -> None:
    import math

    from eagle3_datagen.sglang.logprobs import entropy_summary

    out = tk.output()
    n = len(out)
    lps = [math.log(0.5)] * n
    top_ids = [[t, 9] for t in out]
    tops = [[math.log(0.5), math.log(0.25)]] * n
    summary = entropy_summary(tops)
    assert summary is not None
    cols: dict[str, Any] = {
        "output_logprobs": lps,
        "top_logprob_ids": top_ids,
        "top_logprobs": tops,
        "entropy_mean": summary.mean,
        "entropy_p90": summary.p90,
    }
    parts = good(tk)
    parts["p1"].append(
        Batch(
            [
                tk.record("lp-ok", "p1", out, line=7, **cols),
                tk.record("lp-short", "p1", out, line=8, **{**cols, "output_logprobs": lps[1:]}),
                tk.record("lp-entropy", "p1", out, line=9, **{**cols, "entropy_mean": 3.0}),
                tk.record(
                    "lp-mismatch",
                    "p1",
                    out,
                    line=10,
                    **{**cols, "output_logprobs": [math.log(0.125)] * n},
                ),
            ]
        )
    )
    write_dataset(tmp_path, fp, parts)
    p1 = part(validate_dataset(tmp_path), "p1")
    assert dict(p1.invalid_by_reason) == {
        "logprobs_length": 1,
        "entropy_columns": 1,
        "logprob_mismatch": 1,
    }
