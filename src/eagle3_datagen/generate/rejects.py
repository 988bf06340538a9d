"""The rejects a batch makes: of an input line, of a line or one turn of its conversations, and
of a turn whose output failed validation. Each names the partition's input file and line."""

from __future__ import annotations

import dataclasses
from typing import Any

from eagle3_datagen.config import Partition
from eagle3_datagen.generate.conversation import TurnAt
from eagle3_datagen.inputs.prompts import InputReject, Prompt
from eagle3_datagen.sglang.client import GenerateResult
from eagle3_datagen.validate.tokens import Verdict
from eagle3_datagen.write.records import Reject


def _reject(
    partition: Partition,
    line: int,
    rid: str | None,
    stage: str,
    code: str,
    reason: str,
    **more: Any,
) -> Reject:
    """A reject of line ``line`` of the partition's input; ``more``: its other columns."""
    return Reject(
        partition=partition.name,
        source_file=partition.input,
        source_line=line,
        id=rid,
        stage=stage,
        reason_code=code,
        reason=reason,
        **more,
    )


def input_reject(partition: Partition, rej: InputReject) -> Reject:
    """A line that is no prompt (bad JSON, a missing field): its raw text is kept."""
    reason = f"{partition.input}:{rej.line}: {rej.reason}"
    return _reject(partition, rej.line, rej.id, "input", "bad_input", reason, raw=rej.raw)


def turn_reject(
    partition: Partition,
    prompt: Prompt,
    stage: str,
    code: str,
    reason: str,
    prompt_ids: list[int] | None = None,
    *,
    at: TurnAt | None = None,
) -> Reject:
    """A reject of the line (``at`` None) or of one turn of one of its conversations."""
    if at is None:
        return _reject(
            partition, prompt.line, prompt.id, stage, code, reason, prompt_ids=prompt_ids
        )
    return _reject(
        *(partition, prompt.line, at.id, stage, code, reason),
        prompt_ids=prompt_ids,
        turn=at.turn,
        sample=at.sample,
    )


def validation_reject(
    partition: Partition,
    prompt: Prompt,
    ids: list[int],
    result: GenerateResult,
    verdict: Verdict,
    at: TurnAt,
) -> Reject:
    """A turn whose output failed validation: its first reason's code, all reasons' text."""
    return _reject(
        *(partition, prompt.line, at.id, "validation", verdict.reasons[0][0], verdict.reason_text),
        prompt_ids=ids,
        output_ids=result.output_ids,
        finish_reason=result.finish_type,
        turn=at.turn,
        sample=at.sample,
    )


def earlier_reject(partition: Partition, found: Reject, line: int) -> Reject:
    """A reject an earlier run left for this prompt, at the line the prompt is on now."""
    return dataclasses.replace(found, source_line=line, source_file=partition.input)
