"""A rejected line reads ``file:line: [turn T sample S: ]code: reason`` with each part once,
whichever kind of reject it is (the reasons are stored as the run wrote them)."""

from __future__ import annotations

from eagle3_datagen.report.rejected_lines import RejectedLine
from eagle3_datagen.validate.tokens import Verdict


def test_a_validation_reject_names_its_code_once() -> None:
    verdict = Verdict(reasons=[("think_end_count", "2 think-end tokens (expected exactly one)")])
    line = RejectedLine(
        "lab", "prompts.jsonl", 10, "think_end_count", verdict.reason_text, turn=0, sample=0
    )
    assert line.text() == (
        "prompts.jsonl:10: turn 0 sample 0: think_end_count: 2 think-end tokens (expected "
        "exactly one)"
    )


def test_every_reason_of_a_validation_reject_is_kept() -> None:
    reasons = [("think_end_count", "no think-end token"), ("length", "hit max_new_tokens")]
    verdict = Verdict(reasons=reasons)
    line = RejectedLine("lab", "p.jsonl", 3, "think_end_count", verdict.reason_text, 1, 2)
    assert line.text() == (
        "p.jsonl:3: turn 1 sample 2: think_end_count: no think-end token; length: hit "
        "max_new_tokens"
    )


def test_an_input_reject_names_its_file_and_line_once() -> None:
    line = RejectedLine("p", "in.jsonl", 7, "bad_input", "in.jsonl:7: invalid JSON")
    assert line.text() == "in.jsonl:7: bad_input: invalid JSON"


def test_a_reason_that_only_mentions_the_code_later_is_left_whole() -> None:
    line = RejectedLine("p", "in.jsonl", 7, "duplicate_id", "same id as line 2 (duplicate_id: x)")
    assert line.text() == "in.jsonl:7: duplicate_id: same id as line 2 (duplicate_id: x)"
