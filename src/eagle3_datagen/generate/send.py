"""Sending one turn's request: the retry policy, the tier's slots and the server's budget, a
rid no earlier attempt used; a 4xx becomes the turn's reject, a server lost fails the batch.

:data:`Send` is what a turn needs from the server side; :meth:`TurnSender.send` is the one
that talks to SGLang (a test of a turn or a conversation gives its own, and needs no server)."""

from __future__ import annotations

import asyncio
import functools
import secrets
from collections.abc import Awaitable, Callable
from typing import Any

from eagle3_datagen.config import Partition, RetryPolicy, Tier
from eagle3_datagen.errors import (
    BatchFailed,
    RejectedRequestError,
    RetriesExhaustedError,
    ServerError,
)
from eagle3_datagen.generate.context import RunContext
from eagle3_datagen.generate.media import TurnImages
from eagle3_datagen.report.progress import Progress
from eagle3_datagen.sglang.budget import ServerBudget
from eagle3_datagen.sglang.client import GenerateResult, request_id
from eagle3_datagen.sglang.requests import GenerateClient, generate_with_retries
from eagle3_datagen.sglang.supervisor import ServerSupervisor

Sent = tuple[GenerateResult | None, str | None]


# What a turn needs from the server side: ``send(index, line, prompt_ids, sampling, suffix,
# media)`` sends one turn of batch ``index`` and returns (result, None), or (None, why the
# server refused it); it raises BatchFailed when no retry got an answer. ``line`` and
# ``suffix`` name the turn in its rid (line 7's second turn: 7 and ``-t1``). TurnSender.send is
# the one that talks to SGLang; a test gives its own.
Send = Callable[[int, int, list[int], dict[str, Any], str, TurnImages | None], Awaitable[Sent]]


class TurnSender:
    """One partition's requests to the server: its client, the tier's slots (``in_flight``
    requests at once), the server-wide budget, the lost-server supervisor, the retry policy;
    the tokens and retries counted into ``progress``."""

    def __init__(
        self,
        client: GenerateClient,
        partition: Partition,
        tier: Tier,
        policy: RetryPolicy,
        progress: Progress,
        run: RunContext | None = None,
    ) -> None:
        self.client = client
        self.partition = partition.name
        self.slots = asyncio.Semaphore(tier.in_flight_cap)
        self.max_tokens = tier.max_tokens
        self.policy = policy
        self.progress = progress
        self.top_logprobs = partition.logprobs.top_k if partition.logprobs else None
        # The run's supervisor and server-wide budget (none and the default: a partition
        # without a run, in a test or a benchmark).
        self.supervisor: ServerSupervisor | None = run.supervisor if run else None
        self.budget = run.budget if run else ServerBudget()
        # In every rid, with a token per run of a batch: a batch retried, or another run, never
        # sends a rid SGLang still holds (it answers 400 to one); a run's rids name its flow run.
        self.run_id = run.run_key[:8] if run else secrets.token_hex(4)
        self._batch_run: dict[int, str] = {}

    def new_attempt(self, index: int) -> None:
        """A new attempt of batch ``index``: its requests get rids no earlier attempt used."""
        self._batch_run[index] = f"{self.run_id}-{secrets.token_hex(2)}"

    def batch_run(self, index: int) -> str:
        """The rid prefix of this attempt of batch ``index``: the run's token and the attempt's."""
        return self._batch_run[index]

    async def send(
        self,
        index: int,
        line: int,
        prompt_ids: list[int],
        sampling: dict[str, Any],
        suffix: str = "",
        media: TurnImages | None = None,
    ) -> Sent:
        """Send one request with the retry policy; (result, None) or (None, rejection reason).

        A 4xx is the prompt's fault and becomes a reject. When the tries run out, or the
        server is gone for good, the batch fails (Prefect retries the batch).
        """
        try:
            result = await generate_with_retries(
                self.client,
                prompt_ids,
                sampling,
                rid=functools.partial(
                    request_id, self.batch_run(index), self.partition, f"{line}{suffix}"
                ),
                policy=self.policy,
                reserve_tokens=len(media.expanded if media else prompt_ids) + self.max_tokens,
                image_data=media.image_data() if media else None,
                top_logprobs=self.top_logprobs,
                slots=self.slots,
                supervisor=self.supervisor,
                budget=self.budget,
                share=self.partition,
                on_retry=self.progress.retry,
            )
        except RejectedRequestError as err:
            return None, str(err)
        except (ServerError, RetriesExhaustedError) as err:
            where = f"partition {self.partition}, line {line}"
            raise BatchFailed(f"{where}: {err}") from err
        self.progress.output_tokens += len(result.output_ids)
        self.progress.speculated(result.spec)
        return result, None
