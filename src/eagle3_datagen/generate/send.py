"""Sending one turn's request: the retry policy, the tier's slots and the server's budget, a
rid no earlier attempt used; a 4xx becomes the turn's reject, a server lost fails the batch."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

from eagle3_datagen.errors import (
    BatchFailed,
    RejectedRequestError,
    RetriesExhaustedError,
    ServerError,
)
from eagle3_datagen.generate.media import TurnImages
from eagle3_datagen.inputs.prompts import Prompt
from eagle3_datagen.sglang.client import GenerateResult, request_id
from eagle3_datagen.sglang.requests import generate_with_retries

if TYPE_CHECKING:
    from eagle3_datagen.generate.batch import PartitionRunner


async def send_turn(
    runner: PartitionRunner,
    index: int,
    prompt: Prompt,
    prompt_ids: list[int],
    sampling: dict[str, Any],
    suffix: str = "",
    media: TurnImages | None = None,
) -> tuple[GenerateResult | None, str | None]:
    """Send one request with the retry policy; (result, None) or (None, rejection reason).

    A 4xx is the prompt's fault and becomes a reject. When the tries run out, or the
    server is gone for good, the batch fails (Prefect retries the batch).
    """
    partition = runner.partition
    try:
        result = await generate_with_retries(
            runner.client,
            prompt_ids,
            sampling,
            rid=functools.partial(
                request_id, runner.batch_run(index), partition.name, f"{prompt.line}{suffix}"
            ),
            policy=runner.config.retries,
            reserve_tokens=len(media.expanded if media else prompt_ids) + runner.tier.max_tokens,
            image_data=media.image_data() if media else None,
            top_logprobs=partition.logprobs.top_k if partition.logprobs else None,
            slots=runner.semaphore,
            supervisor=runner.supervisor,
            budget=runner.budget,
            share=partition.name,
            on_retry=runner.progress.retry,
        )
    except RejectedRequestError as err:
        return None, str(err)
    except (ServerError, RetriesExhaustedError) as err:
        where = f"partition {partition.name}, line {prompt.line}"
        raise BatchFailed(f"{where}: {err}") from err
    runner.progress.output_tokens += len(result.output_ids)
    runner.progress.speculated(result.spec)
    return result, None
