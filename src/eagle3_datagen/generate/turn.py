"""One turn of one conversation: its answer found in what earlier runs left or sent for, then
validated, and made the turn's record (or its reject)."""

from __future__ import annotations

import dataclasses
from typing import Any

from eagle3_datagen.config import Logprobs, Partition
from eagle3_datagen.generate.conversation import TurnAt
from eagle3_datagen.generate.earlier import Earlier
from eagle3_datagen.generate.media import TurnImages
from eagle3_datagen.generate.partition_context import PartitionContext
from eagle3_datagen.generate.rejects import earlier_reject, turn_reject, validation_reject
from eagle3_datagen.generate.send import Send
from eagle3_datagen.generate.summary import Outcome
from eagle3_datagen.inputs.modes import thinking_of
from eagle3_datagen.inputs.prompts import Prompt
from eagle3_datagen.sglang.client import GenerateResult
from eagle3_datagen.sglang.logprobs import entropy_summary
from eagle3_datagen.validate.logprobs import check_logprobs
from eagle3_datagen.validate.tokens import ToolCallCheck, Verdict, validate_output
from eagle3_datagen.write.journal import prompt_key
from eagle3_datagen.write.records import Record, Reject, spec_columns


async def run_turn(
    ctx: PartitionContext,
    send: Send,
    index: int,
    prompt: Prompt,
    ids: list[int],
    sampling: dict[str, Any],
    earlier: Earlier,
    out: Outcome,
    at: TurnAt,
    media: TurnImages | None = None,
) -> Record | None:
    """One turn's record: found in what earlier runs left, or generated and validated.
    None when the turn was rejected (the reject is in ``out``). ``media``: the turn's
    images; the ids the model sees are then ``media.expanded``."""
    key = prompt_key(at.id, ids, media.digests if media else ())
    found = earlier.find(key)
    if isinstance(found, Record):
        return dataclasses.replace(found, source_line=prompt.line)
    if isinstance(found, Reject):
        out.end(earlier_reject(ctx.partition, found, prompt.line))
        return None
    result = found
    if result is None:
        suffix = at.id[len(prompt.id) :]
        result, error = await send(index, prompt.line, ids, sampling, suffix, media)
        out.sent += 1
        if result is None:
            reject = turn_reject(
                ctx.partition, prompt, "server", "server_rejected", error or "", ids, at=at
            )
            out.end(reject)
            return None
        earlier.add(key, result)
    verdict = _validate(ctx, prompt, media.expanded if media else ids, result)
    if not verdict.accepted:
        out.end(validation_reject(ctx.partition, prompt, ids, result, verdict, at))
        return None
    return accepted_record(ctx.partition, prompt, ids, media, result, verdict, sampling, at)


def _validate(
    ctx: PartitionContext, prompt: Prompt, seen: list[int], result: GenerateResult
) -> Verdict:
    """The output checked against what the model saw (``seen``: the ids the server counted),
    and its logprobs when the partition asks for them."""
    verdict = validate_output(
        seen,
        result.output_ids,
        finish_type=result.finish_type,
        finish_matched=result.finish_matched,
        prompt_tokens=result.prompt_tokens,
        completion_tokens=result.completion_tokens,
        ids=ctx.ids,
        policy=ctx.validation,
        tool_check=ToolCallCheck(ctx.tokenizer.decode, prompt.tools),
        thinking=thinking_of(ctx.tokenizer.kwargs_for(prompt)),
    )
    asked = ctx.partition.logprobs
    if asked is not None and verdict.accepted:
        check_logprobs(
            result.output_ids,
            result.output_logprobs,
            verdict,
            scored_ids=result.logprob_ids,
            top_ids=result.top_logprob_ids,
            top_logprobs=result.top_logprobs,
            top_k=asked.top_k,
        )
    return verdict


def accepted_record(
    partition: Partition,
    prompt: Prompt,
    ids: list[int],
    media: TurnImages | None,
    result: GenerateResult,
    verdict: Verdict,
    sampling: dict[str, Any],
    at: TurnAt,
) -> Record:
    """The record of an accepted turn: the ids as sent, the output as returned, and for an
    image prompt the ids the model saw and its images."""
    seen = media.expanded if media else ids
    return Record(
        id=at.id,
        partition=partition.name,
        prompt_ids=ids,
        output_ids=result.output_ids,
        finish_reason=result.finish_type,
        prompt_tokens=len(seen),
        completion_tokens=len(result.output_ids),
        truncated=verdict.truncated,
        think_end_index=verdict.think_end_index,
        cached_tokens=result.cached_tokens,
        e2e_latency=result.e2e_latency,
        source_line=prompt.line,
        rid=result.rid,
        conversation_id=prompt.id,
        turn=at.turn,
        sample=at.sample,
        sampling=sampling_columns(sampling),
        model_prompt_ids=media.expanded if media else None,
        images=media.columns() if media else None,
        has_tools=bool(prompt.tools),
        **spec_columns(result.spec),
        **logprob_columns(partition.logprobs, result),
    )


def logprob_columns(asked: Logprobs | None, result: GenerateResult) -> dict[str, Any]:
    """The logprob columns of a validated answer (all null when the partition asks none)."""
    if asked is None:
        return {}
    top = result.top_logprobs if asked.top_k > 0 else None
    summary = entropy_summary(top) if top is not None else None
    return {
        "output_logprobs": result.output_logprobs,
        "top_logprob_ids": result.top_logprob_ids if top is not None else None,
        "top_logprobs": top,
        "entropy_mean": summary.mean if summary else None,
        "entropy_p90": summary.p90 if summary else None,
    }


def sampling_columns(sampling: dict[str, Any]) -> dict[str, Any]:
    """The ``sampling`` column of a record: what decided its draw."""
    return {
        "temperature": sampling["temperature"],
        "top_p": sampling["top_p"],
        "top_k": sampling["top_k"],
        "min_p": sampling["min_p"],
        "repetition_penalty": sampling["repetition_penalty"],
        "max_new_tokens": sampling["max_new_tokens"],
        "sampling_seed": sampling.get("sampling_seed"),
    }
