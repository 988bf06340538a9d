"""A batch's conversations: all of them at once, longest first; the turns of each one after
another, each on the model's own earlier turns (generate/conversation.py)."""

from __future__ import annotations

import asyncio
import dataclasses

from eagle3_datagen.errors import BatchFailed, DatagenError
from eagle3_datagen.generate import offload
from eagle3_datagen.generate.conversation import (
    STOP_REJECTED,
    STOP_TOOL_CALL,
    STOP_TRUNCATED,
    Message,
    TurnAt,
    TurnSlot,
    continue_history,
    plan_turns,
    served_turn,
    tool_call_divergence,
)
from eagle3_datagen.generate.earlier import Earlier
from eagle3_datagen.generate.offload import off_loop
from eagle3_datagen.generate.partition_context import PartitionContext
from eagle3_datagen.generate.prepare import Job
from eagle3_datagen.generate.rejects import turn_reject
from eagle3_datagen.generate.send import Send
from eagle3_datagen.generate.summary import Outcome
from eagle3_datagen.generate.turn import run_turn
from eagle3_datagen.inputs.prompts import Prompt
from eagle3_datagen.render.chat_tokenizer import ChatTokenizer, RenderError
from eagle3_datagen.write.records import Record, Reject


async def run_conversations(
    ctx: PartitionContext, send: Send, index: int, jobs: list[Job], earlier: Earlier
) -> list[Outcome]:
    """Every conversation of the batch (each line, each sample) at once; the turns of one
    conversation one after another. A line counts as done when all its samples are.

    If one request fails for good, the others are cancelled and the batch fails; what
    finished stays in the journal for the retry.

    Longest first: the conversations queue for the tier's slots (and the server budget) in
    order of their prompt length, longest first: the one length known before the answer
    (a longer prompt holds more KV and costs more per output token), so the batch ends
    with its cheapest requests. The length is the one the server holds: an image prompt's
    ids with each placeholder expanded (``Job.seen``). Outcomes come back in line order.
    """
    samples = ctx.partition.samples
    left = {job.prompt.line: samples for job in jobs}

    async def one(prompt: Prompt, ids: list[int], sample: int) -> Outcome:
        outcome = await run_conversation(ctx, send, index, prompt, ids, sample, earlier)
        left[prompt.line] -= 1
        if not left[prompt.line]:
            ctx.progress.line_done(index)
        return outcome

    # sorted() is stable: prompts of one length keep their line order.
    order = sorted(range(len(jobs)), key=lambda j: -jobs[j].seen)
    tasks: list[asyncio.Task[Outcome] | None] = [None] * (len(jobs) * samples)
    try:
        async with asyncio.TaskGroup() as tg:
            for j in order:
                prompt, ids = jobs[j].prompt, jobs[j].ids
                for n in range(samples):
                    tasks[j * samples + n] = tg.create_task(one(prompt, ids, n))
    except BaseExceptionGroup as group:
        failed = [e for e in group.exceptions if isinstance(e, BatchFailed)]
        if failed:
            more = f" (and {len(failed) - 1} more)" if len(failed) > 1 else ""
            raise BatchFailed(f"{failed[0]}{more}") from failed[0]
        ours = [e for e in group.exceptions if isinstance(e, DatagenError)]
        if ours:  # e.g. the journal could not be written: a full disk
            raise ours[0] from None
        raise
    return [t.result() for t in tasks if t is not None]


async def run_conversation(
    ctx: PartitionContext,
    send: Send,
    index: int,
    prompt: Prompt,
    first_ids: list[int],
    sample: int,
    earlier: Earlier,
) -> Outcome:
    """One sample of one line: its turns in order, each on the model's own earlier turns
    (generate/conversation.py). Ends at the last turn, or where a turn is rejected, cut at
    max_tokens, or calls tools other than the data's."""
    slots = plan_turns(prompt, ctx.partition.regenerate)
    temperature = ctx.temperature(sample)
    out = Outcome()
    history = prompt.messages[: slots[0].history_end]
    ids = first_ids
    for pos, slot in enumerate(slots):
        rec_id = ctx.record_id(prompt, slot.index, sample)
        at = TurnAt(rec_id, slot.index, sample)
        if pos:
            later = await _later_turn_ids(ctx, prompt, history, at)
            if isinstance(later, Reject):
                out.end(later)
                break
            ids = later
        sampling = ctx.turn_sampling(rec_id, temperature)
        media = ctx.images(dataclasses.replace(prompt, id=rec_id, messages=history), ids)
        assert not isinstance(media, str)  # checked when the turn was rendered
        record = await run_turn(ctx, send, index, prompt, ids, sampling, earlier, out, at, media)
        if record is None:
            break
        record.has_tool_results = any(m.get("role") == "tool" for m in history)
        record.user_turns = sum(m.get("role") == "user" for m in history)
        record.mode = prompt.mode
        out.records.append(record)
        if pos + 1 == len(slots):
            break
        next_history = _next_history(ctx.tokenizer, prompt, history, ids, record, slots, pos, out)
        if next_history is None:
            break
        history = next_history
    if out.stop is None and out.rejects and len(out.records) + 1 < len(slots):
        out.stop = STOP_REJECTED
    return out


async def _later_turn_ids(
    ctx: PartitionContext, prompt: Prompt, history: list[Message], at: TurnAt
) -> list[int] | Reject:
    """A later turn's ids, rendered on the conversation so far, or the turn's reject: a
    template error, images that do not fit its ids, a prompt too long for the server."""
    partition = ctx.partition
    turn_prompt = dataclasses.replace(prompt, id=at.id, messages=history)
    rendered = (await off_loop(offload.render, ctx.tokenizer, [turn_prompt]))[0]
    if isinstance(rendered, RenderError):
        return turn_reject(partition, prompt, "template", "template_error", rendered.reason, at=at)
    ids = rendered
    turn_media = ctx.images(turn_prompt, ids)
    if isinstance(turn_media, str):
        return turn_reject(partition, prompt, "template", "image_mismatch", turn_media, ids, at=at)
    too_long = ctx.too_long(len(turn_media.expanded if turn_media else ids))
    if too_long:
        return turn_reject(partition, prompt, "input", "prompt_too_long", too_long, ids, at=at)
    return ids


def _next_history(
    tokenizer: ChatTokenizer,
    prompt: Prompt,
    history: list[Message],
    ids: list[int],
    record: Record,
    slots: list[TurnSlot],
    pos: int,
    out: Outcome,
) -> list[Message] | None:
    """The conversation the next turn is rendered on: the model's turn as served, then the
    data up to the next turn. None where it stops here (the turn was cut at max_tokens, or
    its tool calls differ from the data's); the stop is noted on the record and ``out``."""
    if record.truncated:
        record.stop_reason = f"{STOP_TRUNCATED}: the turn reached max_tokens"
        out.stop = STOP_TRUNCATED
        return None
    message, calls = served_turn(
        tokenizer, prompt, history, ids, record.output_ids, record.finish_reason
    )
    diverged = tool_call_divergence(slots[pos].data, calls)
    if diverged is not None:
        record.stop_reason = f"{STOP_TOOL_CALL}: {diverged}"
        out.stop = STOP_TOOL_CALL
        return None
    return continue_history(
        history, message, calls or [], slots[pos], slots[pos + 1], prompt.messages
    )
