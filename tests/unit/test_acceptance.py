"""Acceptance in the records and the reports: hand-counted cases for the parse, the columns, the
consistency check, the slices and the history table."""

from __future__ import annotations

from typing import Any

import pytest

from eagle3_datagen.report.acceptance import acceptance_markdown, rows_acceptance
from eagle3_datagen.report.history import history_rows, history_text
from eagle3_datagen.report.progress import Progress
from eagle3_datagen.sglang.client import GenerateResult
from eagle3_datagen.validate.dataset import spec_problem
from eagle3_datagen.write.records import SPEC_COLUMNS, spec_columns

SPEC = {
    "spec_accept_rate": 6 / 12,
    "spec_accept_length": 11 / 4,
    "spec_num_correct_drafts": 6,
    "spec_num_proposed_drafts": 12,
    "spec_verify_ct": 4,
    "spec_correct_drafts_histogram": [1, 1, 1, 1],
}


def _item(**meta: Any) -> dict[str, Any]:
    base = {"id": "r", "finish_reason": {"type": "stop"}, "prompt_tokens": 3}
    return {"output_ids": list(range(11)), "meta_info": {**base, **meta}}


def test_the_response_s_spec_fields_become_the_record_s_columns() -> None:
    result = GenerateResult.from_json(_item(completion_tokens=11, **SPEC))
    assert result.spec == SPEC
    assert spec_columns(result.spec) == {name: SPEC[name] for name in SPEC_COLUMNS}
    plain = GenerateResult.from_json(_item(completion_tokens=11))
    assert plain.spec is None
    assert spec_columns(plain.spec) == dict.fromkeys(SPEC_COLUMNS)  # null, never 0


def _row(n: int, **spec: Any) -> dict[str, Any]:
    return {"output_ids": [0] * n, "completion_tokens": n, **spec}


def test_spec_fields_are_checked_against_each_other_and_the_output() -> None:
    assert spec_problem(_row(11, **SPEC)) is None
    assert spec_problem(_row(11)) is None  # no speculation: nothing to check
    assert "one per step" in (spec_problem(_row(4, **SPEC)) or "")  # 4 steps need 5 tokens
    bad_hist = {**SPEC, "spec_correct_drafts_histogram": [0, 1, 3]}
    assert "disagrees" in (spec_problem(_row(11, **bad_hist)) or "")
    bad_length = {**SPEC, "spec_accept_length": 3.0}
    assert "completion_tokens / spec_verify_ct" in (spec_problem(_row(11, **bad_length)) or "")


def _rec(partition: str, turn: int, n: int, correct: list[int], **more: Any) -> dict[str, Any]:
    """A record whose verify steps accepted ``correct`` drafts each."""
    hist = [0] * (max(correct) + 1)
    for c in correct:
        hist[c] += 1
    return {
        "partition": partition,
        "turn": turn,
        "completion_tokens": n,
        "spec_verify_ct": len(correct),
        "spec_num_correct_drafts": sum(correct),
        "spec_num_proposed_drafts": 3 * len(correct),
        "spec_correct_drafts_histogram": hist,
        **more,
    }


def test_slices_pool_counters_then_divide() -> None:
    rows = [
        _rec("a", 0, 100, [3, 3], has_tools=True, mode="instant"),  # 8 tokens in 2 steps
        _rec("a", 1, 1000, [0, 1, 2], has_tools=False, images=[{"tokens": 4}], mode="thinking"),
        _rec("b", 0, 5000, [1], has_tools=None),  # 2 in 1
        {"partition": "b", "turn": 0, "completion_tokens": 9, "spec_verify_ct": None},
    ]
    acc = rows_acceptance(rows)
    assert acc is not None
    assert acc.overall.requests == 3
    assert acc.overall.accept_length == pytest.approx(16 / 6)
    by = {name: {k: s.accept_length for k, s in v.items()} for name, v in acc.slices.items()}
    assert by["partition"] == {"a": pytest.approx(14 / 5), "b": 2.0}
    assert by["turn"] == {"0": pytest.approx(10 / 3), "1": 2.0}
    assert by["tools"] == {"no tools": 2.0, "unknown": 2.0, "with tools": 4.0}
    assert by["images"] == {"text only": pytest.approx(10 / 3), "with images": 2.0}
    # Per serving mode; a record from before the column counts as "default".
    assert by["mode"] == {"default": 2.0, "instant": 4.0, "thinking": 2.0}
    assert list(by["output_length"]) == ["<128", "512-2047", "2048-8191"]
    text = acceptance_markdown(acc)
    assert "| tools | with tools | 1 | 2 | 4.00 |" in text
    assert "| mode | instant | 1 | 2 | 4.00 |" in text
    assert rows_acceptance(rows[3:]) is None


def test_the_progress_line_shows_accept_length_only_when_speculating() -> None:
    progress = Progress(total_lines=2)
    progress.speculated(None)
    assert "accept_len" not in progress.line()
    assert "spec_accept_length" not in progress.this_run()
    progress.speculated(SPEC)
    assert progress.line().endswith("accept_len=2.50")  # (6 correct + 4 steps) / 4 steps
    assert progress.this_run()["spec_accept_length"] == 2.5


def test_the_history_table_has_an_accept_length_column_only_when_speculating() -> None:
    night = {"run_name": "n", "started": "2026-12-01T01:00:00", "partitions": {"p": {}}}
    assert "accept len" not in history_text(history_rows([night]))
    spec = {**night, "run_id": "x", "partitions": {"p": {"spec_accept_length": 2.5}}}
    text = history_text(history_rows([night, spec]))
    assert "accept len" in text and "2.50" in text


def test_a_journaled_result_keeps_its_spec_fields(tmp_path: Any) -> None:
    """A retried batch reuses journaled results: their spec fields reach the record too."""
    from eagle3_datagen.write.journal import BatchJournal

    journal = BatchJournal(tmp_path / "j.jsonl")
    spec = GenerateResult.from_json(_item(completion_tokens=11, **SPEC))
    plain = GenerateResult.from_json(_item(completion_tokens=11))
    journal.append(1, spec)
    journal.append(2, plain)
    journal.close()
    loaded = BatchJournal(tmp_path / "j.jsonl").load()
    assert loaded[1].spec == SPEC and loaded[2].spec is None
