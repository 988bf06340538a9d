"""One partition as a subflow: its own tier, client and progress; batches as tasks."""

from __future__ import annotations

import asyncio
import contextlib
import math
from typing import Any

from prefect import flow, get_run_logger
from prefect.artifacts import acreate_progress_artifact, aupdate_progress_artifact

from eagle3_datagen.chat_tokenizer import ChatTokenizer
from eagle3_datagen.config import PipelineConfig
from eagle3_datagen.output import PartitionOutput, summarize
from eagle3_datagen.prompts import find_duplicate_ids, plan_batches
from eagle3_datagen.runner import PartitionRunner, Progress, run_windowed
from eagle3_datagen.server_session import supervisor_for
from eagle3_datagen.sglang.client import SGLangClient
from eagle3_datagen.sglang.launcher import resolve_api_key
from eagle3_datagen.validate import TokenIds
from tasks.batch import generate_batch

PROGRESS_EVERY_S = 10.0


def _artifact_key(partition: str) -> str:
    return "progress-" + "".join(c if c.isalnum() else "-" for c in partition.lower())


async def _report_progress(partition: str, progress: Progress, every_s: float) -> None:
    """Log the seed's progress line and update a progress artifact until cancelled."""
    logger = get_run_logger()
    artifact_id = await acreate_progress_artifact(
        0.0, key=_artifact_key(partition), description=f"{partition}: lines processed"
    )
    while True:
        await asyncio.sleep(every_s)
        logger.info(f"{partition}: {progress.line()}")
        pct = 100.0 * progress.done / progress.total_lines if progress.total_lines else 0.0
        await aupdate_progress_artifact(artifact_id, min(pct, 100.0), description=progress.line())


@flow(name="datagen-partition", flow_run_name="partition-{partition}", log_prints=True)
async def generate_partition(
    config: PipelineConfig,
    partition: str,
    server_url: str,
    context_length: int | None = None,
    parquet_metadata: dict[str, str] | None = None,
    supervisor_key: str | None = None,
) -> dict[str, Any]:
    """Generate one partition's records; fails if any batch failed after its retries."""
    logger = get_run_logger()
    part = config.partition(partition)
    tier = config.tier(part.tier)
    tokenizer = ChatTokenizer(
        config.model.tokenizer_dir,
        trust_remote_code=config.model.trust_remote_code,
        chat_template_kwargs=config.model.chat_template_kwargs,
    )
    ids = TokenIds.resolve(tokenizer, config.special_tokens)
    output = PartitionOutput(config.output_dir, partition)
    batches = list(plan_batches(partition, part.input, config.batch_size))
    logger.info(
        f"{partition}: {sum(b.count for b in batches)} lines in {len(batches)} batches, "
        f"tier {tier.name} (concurrency {tier.concurrency}, max_tokens {tier.max_tokens})"
    )
    duplicates = find_duplicate_ids(partition, part.input)
    if duplicates:
        logger.warning(f"{partition}: {len(duplicates)} lines repeat an earlier id; rejected")
    # Enough batches in flight to keep the tier's slots full across batch boundaries.
    window = max(2, math.ceil(tier.concurrency / config.batch_size) + 1)
    async with SGLangClient(
        server_url,
        api_key=resolve_api_key(config.server),
        timeout_s=config.server.request_timeout_s,
        max_connections=tier.concurrency + 8,
    ) as client:
        runner = PartitionRunner(
            config=config,
            partition=partition,
            tokenizer=tokenizer,
            ids=ids,
            client=client,
            output=output,
            context_length=context_length,
            metadata=parquet_metadata,
            duplicates=duplicates,
            supervisor=supervisor_for(supervisor_key),
        )
        runner.progress.total_lines = sum(b.count for b in batches)
        reporter = asyncio.create_task(
            _report_progress(partition, runner.progress, PROGRESS_EVERY_S)
        )
        try:
            results = await run_windowed(
                iter(batches), lambda spec: generate_batch(runner, spec), window
            )
        finally:
            reporter.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await reporter
    logger.info(f"{partition}: {runner.progress.line()}")
    failures = [r for r in results if isinstance(r, BaseException)]
    summary = summarize(partition, output.batch_summaries())
    if failures:
        raise RuntimeError(
            f"partition {partition}: {len(failures)} of {len(batches)} batches failed; "
            f"first: {failures[0]}"
        )
    return summary
