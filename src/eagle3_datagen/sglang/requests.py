"""One ``/generate`` request with the pipeline's retry policy, usable without a partition.

Transient failures (transport errors, timeouts, 429, 5xx, an ``abort`` finish) are retried with
exponential backoff and jitter. A 4xx is the prompt's fault: :class:`RejectedRequestError` goes
to the caller at once, never retried. A server that is gone for good (:class:`ServerError`)
also goes to the caller. Anything that only limits the request (a concurrency semaphore, the
server-wide budget, the lost-server supervisor, which also cancels the request when the run
stops) is optional, so a single request (e.g. a
pre-flight smoke request) follows the same policy as the batches do.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Callable
from typing import Any, Protocol

from eagle3_datagen.config import RetryPolicy
from eagle3_datagen.errors import RetriesExhaustedError, RetryableRequestError
from eagle3_datagen.sglang.budget import ServerBudget
from eagle3_datagen.sglang.client import GenerateRequest, GenerateResult
from eagle3_datagen.sglang.supervisor import ServerSupervisor


class GenerateClient(Protocol):
    """What a request needs from a server: one SGLangClient, or a ServerPool of several."""

    async def generate(self, request: GenerateRequest) -> GenerateResult: ...


def backoff_s(policy: RetryPolicy, attempt: int) -> float:
    """Seconds to wait before try ``attempt`` (1-based retries): doubling, capped, jittered."""
    delay = min(policy.backoff_max_s, policy.backoff_initial_s * 2 ** (attempt - 1))
    return delay * (0.5 + random.random())


async def generate_with_retries(
    client: GenerateClient,
    input_ids: list[int],
    sampling: dict[str, Any],
    *,
    rid: str | Callable[[int], str],
    policy: RetryPolicy,
    reserve_tokens: int = 0,
    slots: asyncio.Semaphore | None = None,
    supervisor: ServerSupervisor | None = None,
    budget: ServerBudget | None = None,
    share: str = "",
    on_retry: Callable[[], None] | None = None,
    image_data: list[str] | None = None,
    top_logprobs: int | None = None,
) -> GenerateResult:
    """Send one request until it succeeds; each try's rid is ``rid(attempt)``, or
    ``<rid>:<attempt>`` for a string (SGLang refuses a rid it still holds, so no two tries share
    one).

    Waits, in order, for a slot of ``slots``, for the ``supervisor`` (while a lost server is
    recovered) and for ``reserve_tokens`` of the ``budget`` (queued with the ``share``, the
    partition, so partitions get fair places). ``on_retry`` is called for every
    failed try that is retried. ``top_logprobs``: ask for output logprobs (client.generate).
    An ``abort`` on the last try is returned as it is (the caller's
    validation rejects it). Raises :class:`RetriesExhaustedError` when the tries run out.
    """
    last_error = ""
    for attempt in range(policy.max_attempts):
        if attempt:
            await asyncio.sleep(backoff_s(policy, attempt))
        try:
            async with slots if slots is not None else contextlib.nullcontext():
                if supervisor is not None:
                    await supervisor.before_request()
                async with (
                    budget.reserve(reserve_tokens, share)
                    if budget is not None
                    else contextlib.nullcontext()
                ):
                    try_rid = rid(attempt) if callable(rid) else f"{rid}:{attempt}"
                    request = client.generate(
                        GenerateRequest(input_ids, sampling, try_rid, image_data, top_logprobs)
                    )
                    result = await (
                        supervisor.guard(request) if supervisor is not None else request
                    )
                if budget is not None:
                    sent = result.prompt_tokens if image_data else len(input_ids)  # expanded
                    used = sent + len(result.output_ids)
                    budget.observe(share, reserve_tokens, used)
                    budget.retractions_reported += result.num_retractions
        except RetryableRequestError as err:
            if on_retry is not None:
                on_retry()
            last_error = str(err)
            if err.status is None and supervisor is not None:
                supervisor.on_connection_error(str(err))
            continue
        if supervisor is not None:
            supervisor.on_success()
        if result.finish_type == "abort" and attempt + 1 < policy.max_attempts:
            if on_retry is not None:
                on_retry()
            last_error = f"aborted: {result.finish_message}"
            continue
        return result
    raise RetriesExhaustedError(
        f"request failed after {policy.max_attempts} attempts: {last_error}"
    )
