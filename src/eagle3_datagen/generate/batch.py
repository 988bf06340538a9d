"""One batch of one partition, end to end: parse, render, generate, validate, write.

This is the pipeline's logic with no Prefect in it; a Prefect task wraps :meth:`run_batch`.
Batches of a partition run concurrently and share one client and one semaphore sized by the
tier's concurrency, so the server's slots stay full across batch boundaries.

The steps of one batch, in the order :meth:`PartitionRunner._run_batch` calls them:

1. ``generate/prepare.py``: the lines parsed and their first turns rendered (jobs or rejects),
   and what earlier attempts left (``generate/earlier.py``: the journal, superseded results);
2. ``generate/converse.py``: every conversation at once, each one's turns in order; a turn
   (``generate/turn.py``) is reused or sent (``generate/send.py``), then validated;
3. ``generate/summary.py``: the outcomes counted into the batch's summary, and the batch
   written with its commit marker.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from typing import Any

from eagle3_datagen.config import PipelineConfig, Tier
from eagle3_datagen.generate import gc_tuning
from eagle3_datagen.generate.conversation import record_id
from eagle3_datagen.generate.converse import run_conversations
from eagle3_datagen.generate.media import TurnImages, turn_images
from eagle3_datagen.generate.offload import off_loop
from eagle3_datagen.generate.plan import PartitionPlan
from eagle3_datagen.generate.prepare import prepare_batch
from eagle3_datagen.generate.summary import commit_batch, summarize_batch
from eagle3_datagen.inputs.near_dups import Similar
from eagle3_datagen.inputs.prompts import BatchSpec, Prompt
from eagle3_datagen.render.chat_tokenizer import ChatTokenizer
from eagle3_datagen.render.token_ids import TokenIds
from eagle3_datagen.report.progress import Progress
from eagle3_datagen.sglang.budget import ServerBudget
from eagle3_datagen.sglang.client import SGLangClient
from eagle3_datagen.sglang.pool import ServerPool, connect
from eagle3_datagen.sglang.preflight import length_rejection
from eagle3_datagen.sglang.requests import GenerateClient
from eagle3_datagen.sglang.supervisor import ServerSupervisor
from eagle3_datagen.write.resume import ReusePool
from eagle3_datagen.write.shards import BatchSummary, PartitionOutput


class PartitionRunner:
    """Shared state of one partition's run: tokenizer, client, limits, output directory."""

    def __init__(
        self,
        *,
        config: PipelineConfig,
        partition: str,
        tokenizer: ChatTokenizer,
        ids: TokenIds,
        client: GenerateClient,
        output: PartitionOutput,
        context_length: int | None = None,
        max_req_input_len: int | None = None,
        metadata: dict[str, str] | None = None,
        duplicates: dict[int, int] | None = None,
        dropped: dict[int, Similar] | None = None,
        refused_kwargs: dict[str, str] | None = None,
        supervisor: ServerSupervisor | None = None,
        budget: ServerBudget | None = None,
        run_id: str | None = None,
        reuse: ReusePool | None = None,
    ) -> None:
        self.config = config
        self.partition = config.partition(partition)
        self.tier: Tier = config.tier(self.partition.tier)
        self.tokenizer = tokenizer
        self.ids = ids
        self.client = client
        self.output = output
        self.context_length = context_length
        self.max_req_input_len = max_req_input_len
        self.metadata = metadata or {}
        self.duplicates = duplicates or {}  # line -> earlier line with the same id
        self.dropped = dropped or {}  # line -> the earlier prompt it repeats (policy drop)
        self.refused_kwargs = refused_kwargs or {}  # kwargs_key -> why the template refuses
        self.supervisor = supervisor
        self.budget = budget or ServerBudget()
        self.reuse = reuse or ReusePool()  # results of superseded batches, by prompt key
        self.semaphore = asyncio.Semaphore(self.tier.in_flight_cap)
        self.sampling = config.sampling.to_sglang(self.tier.max_tokens, list(ids.stop_ids))
        # In every rid, with a token per run of a batch: a batch retried, or another run, never
        # sends a rid SGLang still holds (it answers 400 to one).
        self.run_id = run_id or secrets.token_hex(4)
        self._batch_run: dict[int, str] = {}
        self.progress = Progress()
        gc_tuning.tune_for_batches()  # the collector off the loop's way (generate/gc_tuning.py)

    @classmethod
    def from_plan(
        cls,
        plan: PartitionPlan,
        *,
        config: PipelineConfig,
        partition: str,
        client: GenerateClient,
        **options: Any,
    ) -> PartitionRunner:
        """The runner of a planned partition: the plan's tokenizer, ids, repeated ids and
        reusable results, writing to the partition's directory; ``options`` as in __init__."""
        return cls(
            config=config,
            partition=partition,
            tokenizer=plan.tokenizer,
            ids=plan.ids,
            client=client,
            output=PartitionOutput(config.output_dir, partition),
            duplicates=plan.duplicates,
            dropped=plan.dropped,
            refused_kwargs=plan.refused_kwargs,
            reuse=plan.reuse,
            **options,
        )

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
        self._batch_run[spec.index] = f"{self.run_id}-{secrets.token_hex(2)}"
        done = self.output.committed(spec.index, spec.key)
        if done is not None:
            self.progress.batch_skipped(done.lines)
            return done
        t0 = time.monotonic()
        jobs, rejects, earlier = await off_loop(prepare_batch, self, spec)
        self.progress.batch_started(spec.index, spec.count - len(jobs))
        try:
            outcomes = await run_conversations(self, spec.index, jobs, earlier)
            await earlier.writer.drain()  # a journal write that failed fails the batch
        finally:
            await earlier.writer.close()
        summary, records = summarize_batch(spec, outcomes, rejects)
        summary.wall_s = round(time.monotonic() - t0, 3)
        await off_loop(
            commit_batch, self.output, summary, records, rejects, self.metadata, earlier.journal
        )
        self.progress.batch_committed(
            spec.index,
            lines=spec.count,
            accepted=summary.accepted,
            rejected=summary.rejected,
            truncated=summary.truncated,
            rejects_by_reason=summary.rejects_by_reason,
        )
        return summary

    def raise_if_server_lost(self) -> None:
        """A batch must not start once the run has stopped (the server gone for good, or any
        other cause no retry can fix): it raises the stopping cause's error."""
        if self.supervisor is not None:
            self.supervisor.raise_if_stopped()

    def batch_run(self, index: int) -> str:
        """The rid prefix of this attempt of batch ``index``: the run's token and the attempt's."""
        return self._batch_run[index]

    def record_id(self, prompt: Prompt, turn: int, sample: int) -> str:
        """The id of the record one turn of one sample of ``prompt`` makes."""
        return record_id(
            prompt.id,
            turn,
            sample,
            turns=self.partition.regenerate == "all_turns",
            samples=self.partition.samples,
        )

    def images(self, prompt: Prompt, ids: list[int]) -> TurnImages | str | None:
        """The turn's images (None for a text prompt or a turn without images), or why they do
        not fit its ids."""
        return turn_images(self.tokenizer, prompt, ids) if prompt.images else None

    def too_long(self, prompt_len: int) -> str | None:
        """Why a prompt of ``prompt_len`` tokens (as the model sees it) does not fit the
        server's context with the tier's max_tokens, or None (also when the limit is unknown)."""
        if self.context_length is None:
            return None
        reason = length_rejection(
            prompt_len, self.tier.max_tokens, self.context_length, self.max_req_input_len
        )
        return reason.removeprefix("prompt_too_long: ") if reason else None


def connect_partition(
    config: PipelineConfig, partition: str, url: str, api_key: str | None
) -> SGLangClient | ServerPool:
    """The client one partition's requests share: connections for its tier's requests in
    flight and a few spare, the config's request timeout."""
    tier = config.tier(config.partition(partition).tier)
    return connect(
        url,
        api_key=api_key,
        timeout_s=config.server.request_timeout_s,
        max_connections=tier.in_flight_cap + 8,
    )
