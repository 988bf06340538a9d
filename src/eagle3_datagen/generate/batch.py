"""One batch of one partition, end to end: parse, render, generate, validate, write.

This is the pipeline's logic with no Prefect in it; a Prefect task wraps :meth:`run_batch`.
Batches of a partition run concurrently and share one client and one semaphore sized by the
tier's concurrency, so the server's slots stay full across batch boundaries.

The runner holds the partition's fixed parts (``generate/partition_context.py``) and its sender
(``generate/send.py``); the steps take those, never the runner, so nothing below imports this
module. The steps of one batch, in the order :meth:`PartitionRunner._run_batch` calls them:

1. ``generate/prepare.py``: the lines parsed and their first turns rendered (jobs or rejects),
   and what earlier attempts left (``generate/earlier.py``: the journal, superseded results);
2. ``generate/converse.py``: every conversation at once, each one's turns in order; a turn
   (``generate/turn.py``) is reused or sent (through the sender), then validated;
3. ``generate/summary.py``: the outcomes counted into the batch's summary, and the batch
   written with its commit marker.
"""

from __future__ import annotations

import asyncio
import time

from eagle3_datagen.config import PipelineConfig
from eagle3_datagen.generate import gc_tuning
from eagle3_datagen.generate.context import PartitionJob
from eagle3_datagen.generate.converse import run_conversations
from eagle3_datagen.generate.offload import off_loop
from eagle3_datagen.generate.partition_context import PartitionContext
from eagle3_datagen.generate.plan import PartitionPlan
from eagle3_datagen.generate.prepare import prepare_batch
from eagle3_datagen.generate.send import TurnSender
from eagle3_datagen.generate.summary import commit_batch, summarize_batch
from eagle3_datagen.inputs.prompts import BatchSpec
from eagle3_datagen.sglang.client import SGLangClient
from eagle3_datagen.sglang.pool import ServerPool, connect
from eagle3_datagen.sglang.requests import GenerateClient
from eagle3_datagen.write.shards import BatchSummary


class PartitionRunner:
    """One partition's run: its fixed parts (``ctx``, a PartitionContext), the sender its turns
    go through (``sender``: the client, the tier's slots, the run's budget and supervisor, the
    retry policy), and the supervisor that stops every partition at once."""

    def __init__(self, job: PartitionJob, ctx: PartitionContext, client: GenerateClient) -> None:
        self.ctx = ctx
        self.sender = TurnSender(
            client, ctx.partition, ctx.tier, job.config.retries, ctx.progress, job.run
        )
        self.retries = job.config.retries
        self.supervisor = job.run.supervisor if job.run else None
        self.metadata = job.parquet_metadata or {}
        self.output = ctx.output
        self.progress = ctx.progress
        gc_tuning.tune_for_batches()  # the collector off the loop's way (generate/gc_tuning.py)

    @classmethod
    def from_plan(
        cls, plan: PartitionPlan, job: PartitionJob, client: GenerateClient
    ) -> PartitionRunner:
        """The runner of a planned partition: the plan's tokenizer, ids, repeated ids, refused
        kwargs and reusable results."""
        ctx = PartitionContext.build(
            job,
            plan.tokenizer,
            plan.ids,
            plan.duplicates,
            plan.dropped,
            plan.reuse,
            refused_kwargs=plan.refused_kwargs,
        )
        return cls(job, ctx, client)

    async def committed_before(self, spec: BatchSpec) -> BatchSummary | None:
        """The summary of a batch an earlier run (or attempt) committed, counted as done; None
        when it is still to do. The partition asks before it starts a task for the batch, so a
        committed batch gets none (it would only read this marker)."""
        done = await off_loop(self.output.committed, spec.index, spec.key)
        if done is not None:
            self.progress.batch_skipped(done.lines)
        return done

    async def run_batch(self, spec: BatchSpec) -> BatchSummary:
        """Process one batch end to end, or return its summary if it was committed before.

        A failure no retry can fix (``errors.final_cause``) stops the whole run: every
        partition, at once (``ServerSupervisor.stop``). A failed attempt's settled lines stop
        counting as done (its retry counts them again as it finds them in the journal). A
        stopped batch's stay done: they are in its journal, which a rerun reuses, and a
        stop must never move progress backwards."""
        try:
            return await self._run_batch(spec)
        except asyncio.CancelledError:
            raise
        except BaseException as err:
            self.progress.batch_failed(spec.index)
            if isinstance(err, Exception) and self.supervisor is not None:
                self.supervisor.stop(err)
            raise

    async def _run_batch(self, spec: BatchSpec) -> BatchSummary:
        """The batch's steps in order. Reading and rendering the batch, its journal and its
        Parquet write run on worker threads (``generate/offload.py``): the event loop only
        sends, receives and validates."""
        self.raise_if_server_lost()
        self.progress.attempt(spec.index)
        self.sender.new_attempt(spec.index)
        done = self.output.committed(spec.index, spec.key)
        if done is not None:
            self.progress.batch_skipped(done.lines)
            return done
        t0 = time.monotonic()
        jobs, rejects, earlier = await off_loop(prepare_batch, self.ctx, spec)
        self.progress.batch_started(spec.index, spec.count - len(jobs))
        try:
            outcomes = await run_conversations(
                self.ctx, self.sender.send, spec.index, jobs, earlier
            )
            await earlier.writer.drain()  # a journal write that failed fails the batch
        finally:
            await earlier.writer.close()
        summary, records = summarize_batch(spec, outcomes, rejects)
        summary.wall_s = round(time.monotonic() - t0, 3)
        await off_loop(
            commit_batch, self.output, summary, records, rejects, self.metadata, earlier.journal
        )
        self.progress.batch_committed(summary)
        return summary

    def raise_if_server_lost(self) -> None:
        """A batch must not start once the run has stopped (the server gone for good, or any
        other cause no retry can fix): it raises the stopping cause's error."""
        if self.supervisor is not None:
            self.supervisor.raise_if_stopped()


def connect_partition(
    config: PipelineConfig, partition: str, url: str, api_key: str | None
) -> SGLangClient | ServerPool:
    """The client one partition's requests share: connections for its tier's requests in
    flight and a few spare, the config's request timeout."""
    tier = config.tier(config.partition(partition).tier)
    return connect(
        url,
        api_key=api_key,
        timeout_s=config.server.limits.request_timeout_s,
        max_connections=tier.in_flight_cap + 8,
    )
