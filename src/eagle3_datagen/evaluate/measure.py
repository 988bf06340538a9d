"""Send the held-out prompts to the speculating server and read each answer's counters.

Each record's stored ``prompt_ids`` go to the native ``/generate`` as ``input_ids`` with its
own sampling, through the pipeline's client and retry policy, at most ``concurrency`` at once.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Callable

from eagle3_datagen.config import RetryPolicy
from eagle3_datagen.errors import ServerError
from eagle3_datagen.evaluate.records import HeldOutRecord
from eagle3_datagen.evaluate.slices import Measured, measured
from eagle3_datagen.sglang.requests import GenerateClient, generate_with_retries
from eagle3_datagen.sglang.speculative import SpeculativeSettings, parse_spec_meta


async def _one(
    client: GenerateClient,
    rec: HeldOutRecord,
    settings: SpeculativeSettings,
    *,
    token: str,
    policy: RetryPolicy,
    slots: asyncio.Semaphore,
) -> Measured:
    result = await generate_with_retries(
        client,
        rec.prompt_ids,
        rec.sampling,
        rid=f"eval-{token}:{rec.partition}:{rec.id}",
        policy=policy,
        slots=slots,
    )
    if result.finish_type == "abort":
        raise ServerError(f"{rec.partition}/{rec.id}: aborted: {result.finish_message}")
    meta = {
        **(result.spec or {}),
        "completion_tokens": result.completion_tokens,
        "num_retractions": result.num_retractions,
    }
    stats = parse_spec_meta(meta, settings)
    if stats is None:  # not reached: the server was checked to speculate
        raise ServerError(f"{rec.partition}/{rec.id}: the server sent no speculative counters")
    return measured(rec.partition, rec.turn, rec.has_tools, stats, rec.mode)


async def measure(
    client: GenerateClient,
    records: list[HeldOutRecord],
    settings: SpeculativeSettings,
    *,
    concurrency: int,
    policy: RetryPolicy | None = None,
    on_done: Callable[[int], None] | None = None,
) -> list[Measured]:
    """Every record's counters, in the records' order; the first failure cancels the rest."""
    slots = asyncio.Semaphore(max(1, concurrency))
    token = secrets.token_hex(4)
    policy = policy or RetryPolicy()
    done = 0

    async def one(rec: HeldOutRecord) -> Measured:
        nonlocal done
        measured = await _one(client, rec, settings, token=token, policy=policy, slots=slots)
        done += 1
        if on_done is not None:
            on_done(done)
        return measured

    try:
        async with asyncio.TaskGroup() as group:
            tasks = [group.create_task(one(rec)) for rec in records]
    except ExceptionGroup as group_error:
        raise group_error.exceptions[0] from None  # the first cause, as one line
    return [t.result() for t in tasks]
