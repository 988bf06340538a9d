"""One batch of one partition, end to end: parse, render, generate, validate, write.

This is the pipeline's logic with no Prefect in it; a Prefect task wraps :meth:`run_batch`.
Batches of a partition run concurrently and share one client and one semaphore sized by the
tier's concurrency, so the server's slots stay full across batch boundaries.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import secrets
import time
from collections import Counter

from eagle3_datagen.config import PipelineConfig, Tier
from eagle3_datagen.errors import (
    BatchFailed,
    DatagenError,
    RejectedRequestError,
    RetriesExhaustedError,
    ServerError,
    ServerLost,
)
from eagle3_datagen.generate.progress import Progress
from eagle3_datagen.generate.requests import GenerateClient, generate_with_retries
from eagle3_datagen.inputs.prompts import BatchSpec, InputReject, Prompt, parse_prompt, read_batch
from eagle3_datagen.render.chat_tokenizer import ChatTokenizer, RenderError
from eagle3_datagen.sglang.budget import ServerBudget
from eagle3_datagen.sglang.client import GenerateResult, request_id
from eagle3_datagen.sglang.preflight import length_rejection
from eagle3_datagen.sglang.supervisor import ServerSupervisor
from eagle3_datagen.validate.tokens import TokenIds, validate_output
from eagle3_datagen.write.journal import BatchJournal, prompt_key
from eagle3_datagen.write.records import Record, Reject
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

    async def run_batch(self, spec: BatchSpec) -> BatchSummary:
        """Process one batch end to end, or return its summary if it was committed before."""
        self.raise_if_server_lost()
        self.progress.attempt(spec.index)
        self._batch_run[spec.index] = f"{self.run_id}-{secrets.token_hex(2)}"
        done = self.output.committed(spec.index, spec.key)
        if done is not None:
            self.progress.batch_skipped(done.lines)
            return done
        t0 = time.monotonic()
        summary = BatchSummary(spec.partition, spec.index, spec.first_line, spec.count)
        records: list[Record] = []
        rejects: list[Reject] = []

        prompts: list[Prompt] = []
        for line, raw in read_batch(spec):
            parsed = parse_prompt(raw, line)
            if isinstance(parsed, InputReject):
                rejects.append(self._input_reject(parsed))
            else:
                prompts.append(parsed)
        rendered = self.tokenizer.render(prompts) if prompts else []

        jobs: list[tuple[Prompt, list[int]]] = []
        for prompt, ids in zip(prompts, rendered, strict=True):
            first = self.duplicates.get(prompt.line)
            if first is not None:
                reason = f"id {prompt.id!r} already used on line {first}"
                rejects.append(self._reject(prompt, "input", "duplicate_id", reason))
                continue
            if isinstance(ids, RenderError):
                rejects.append(self._reject(prompt, "template", "template_error", ids.reason))
                continue
            too_long = self._too_long(len(ids))
            if too_long:
                rejects.append(self._reject(prompt, "input", "prompt_too_long", too_long, ids))
                continue
            jobs.append((prompt, ids))

        journal = BatchJournal(self.output.journal_path(spec.index))
        jobs, journaled, reused = self._take_earlier(jobs, journal)
        records.extend(r for r in reused if isinstance(r, Record))
        rejects.extend(r for r in reused if isinstance(r, Reject))
        resent = sum(1 for p, _ in jobs if p.line not in journaled)
        self.progress.batch_started(spec.index, spec.count - resent)
        try:
            results = await self._generate_all(spec.index, jobs, journaled, journal)
        finally:
            journal.close()
        summary.requests_sent = resent
        for (prompt, prompt_ids), (result, error) in zip(jobs, results, strict=True):
            if error is not None:
                rejects.append(self._reject(prompt, "server", "server_rejected", error, prompt_ids))
                continue
            assert result is not None
            verdict = validate_output(
                prompt_ids,
                result.output_ids,
                finish_type=result.finish_type,
                finish_matched=result.finish_matched,
                prompt_tokens=result.prompt_tokens,
                completion_tokens=result.completion_tokens,
                ids=self.ids,
                policy=self.config.validation,
            )
            if not verdict.accepted:
                rejects.append(
                    Reject(
                        partition=spec.partition,
                        source_file=spec.path,
                        source_line=prompt.line,
                        id=prompt.id,
                        stage="validation",
                        reason_code=verdict.reasons[0][0],
                        reason=verdict.reason_text,
                        prompt_ids=prompt_ids,
                        output_ids=result.output_ids,
                        finish_reason=result.finish_type,
                    )
                )
                continue
            records.append(
                Record(
                    id=prompt.id,
                    partition=spec.partition,
                    prompt_ids=prompt_ids,
                    output_ids=result.output_ids,
                    finish_reason=result.finish_type,
                    prompt_tokens=len(prompt_ids),
                    completion_tokens=len(result.output_ids),
                    truncated=verdict.truncated,
                    think_end_index=verdict.think_end_index,
                    cached_tokens=result.cached_tokens,
                    e2e_latency=result.e2e_latency,
                    source_line=prompt.line,
                    rid=result.rid,
                )
            )

        for record in records:
            summary.truncated += record.truncated
            summary.prompt_tokens += len(record.prompt_ids)
            summary.output_tokens += len(record.output_ids)
            summary.output_lengths.append(len(record.output_ids))
            if record.think_end_index >= 0:
                summary.thinking_lengths.append(record.think_end_index)

        summary.accepted = len(records)
        summary.rejected = len(rejects)
        summary.rejects_by_reason = dict(Counter(r.reason_code for r in rejects))
        if summary.accepted + summary.rejected != spec.count:
            raise BatchFailed(
                f"{spec.label}: {spec.count} input lines but {summary.accepted} accepted + "
                f"{summary.rejected} rejected; refusing to commit a batch that lost lines"
            )
        summary.wall_s = round(time.monotonic() - t0, 3)
        summary.input_key = spec.key
        records.sort(key=lambda r: r.source_line)
        rejects.sort(key=lambda r: r.source_line)
        self.output.write_batch(summary, records, rejects, self.metadata)
        journal.remove()  # committed: the marker now stands for these results
        self.progress.batch_committed(
            spec.index,
            lines=spec.count,
            accepted=summary.accepted,
            rejected=summary.rejected,
            truncated=summary.truncated,
            rejects_by_reason=summary.rejects_by_reason,
        )
        return summary

    async def _generate_all(
        self,
        index: int,
        jobs: list[tuple[Prompt, list[int]]],
        journaled: dict[int, GenerateResult],
        journal: BatchJournal,
    ) -> list[tuple[GenerateResult | None, str | None]]:
        """Run the batch's requests not already journaled; journal each result as it arrives.

        If one request fails for good, the others are cancelled and the batch fails; what
        finished stays in the journal for the retry.
        """

        async def one(prompt: Prompt, ids: list[int]) -> tuple[GenerateResult | None, str | None]:
            if prompt.line in journaled:
                return journaled[prompt.line], None
            result, error = await self._generate(index, prompt, ids)
            if result is not None:
                journal.append(prompt_key(prompt.id, ids), result)
            return result, error

        try:
            async with asyncio.TaskGroup() as tg:
                tasks = [tg.create_task(one(p, ids)) for p, ids in jobs]
        except BaseExceptionGroup as group:
            failed = [e for e in group.exceptions if isinstance(e, BatchFailed)]
            if failed:
                more = f" (and {len(failed) - 1} more)" if len(failed) > 1 else ""
                raise BatchFailed(f"{failed[0]}{more}") from failed[0]
            ours = [e for e in group.exceptions if isinstance(e, DatagenError)]
            if ours:  # e.g. the journal could not be written: a full disk
                raise ours[0] from None
            raise
        return [t.result() for t in tasks]

    def raise_if_server_lost(self) -> None:
        """A batch must not start once the server is gone for good (no request could succeed)."""
        if self.supervisor is not None and self.supervisor.failed:
            raise ServerLost(self.supervisor.failed)

    def _take_earlier(
        self, jobs: list[tuple[Prompt, list[int]]], journal: BatchJournal
    ) -> tuple[list[tuple[Prompt, list[int]]], dict[int, GenerateResult], list[Record | Reject]]:
        """Split the batch's prompts by what earlier runs left, matched by (id, prompt ids).

        Returns the prompts still to validate (those to send, and those with a journaled
        result: ``{line: result}``) and the records and rejects copied from superseded batches
        (with the line they sit on now). Nothing is matched by line number: the input may have
        changed since. A result found in another batch's journal is copied into this one's, so
        it outlives that journal.
        """
        journaled = journal.load()
        keys = [prompt_key(p.id, ids) for p, ids in jobs]
        missing = [k for k in keys if k not in journaled]
        earlier = self.reuse.take(missing) if missing and len(self.reuse) else {}
        todo: list[tuple[Prompt, list[int]]] = []
        by_line: dict[int, GenerateResult] = {}
        copied: list[Record | Reject] = []
        for (prompt, ids), key in zip(jobs, keys, strict=True):
            found = journaled.get(key) or earlier.get(key)
            if isinstance(found, Record):
                copied.append(dataclasses.replace(found, source_line=prompt.line))
                continue
            if isinstance(found, Reject):
                copied.append(
                    dataclasses.replace(
                        found, source_line=prompt.line, source_file=self.partition.input
                    )
                )
                continue
            if found is not None:
                by_line[prompt.line] = found
                if key not in journaled:
                    journal.append(key, found)
            todo.append((prompt, ids))
        return todo, by_line, copied

    def _too_long(self, prompt_len: int) -> str | None:
        if self.context_length is None:
            return None
        reason = length_rejection(
            prompt_len, self.tier.max_tokens, self.context_length, self.max_req_input_len
        )
        return reason.removeprefix("prompt_too_long: ") if reason else None

    async def _generate(
        self, index: int, prompt: Prompt, prompt_ids: list[int]
    ) -> tuple[GenerateResult | None, str | None]:
        """Send one request with the retry policy; (result, None) or (None, rejection reason).

        A 4xx is the prompt's fault and becomes a reject. When the tries run out, or the
        server is gone for good, the batch fails (Prefect retries the batch).
        """
        sampling = self.sampling
        if (seed := self.config.sampling.request_seed(prompt.id)) is not None:
            sampling = {**sampling, "sampling_seed": seed}  # one seed per prompt
        try:
            result = await generate_with_retries(
                self.client,
                prompt_ids,
                sampling,
                rid=functools.partial(
                    request_id, self._batch_run[index], self.partition.name, prompt.line
                ),
                policy=self.config.retries,
                reserve_tokens=len(prompt_ids) + self.tier.max_tokens,
                slots=self.semaphore,
                supervisor=self.supervisor,
                budget=self.budget,
                share=self.partition.name,
                on_retry=self._count_retry,
            )
        except RejectedRequestError as err:
            self.progress.line_done(index)
            return None, str(err)
        except (ServerError, RetriesExhaustedError) as err:
            where = f"partition {self.partition.name}, line {prompt.line}"
            raise BatchFailed(f"{where}: {err}") from err
        self.progress.line_done(index, len(result.output_ids))
        return result, None

    def _count_retry(self) -> None:
        self.progress.retry()

    def _input_reject(self, rej: InputReject) -> Reject:
        return Reject(
            partition=self.partition.name,
            source_file=self.partition.input,
            source_line=rej.line,
            id=rej.id,
            stage="input",
            reason_code="bad_input",
            reason=f"{self.partition.input}:{rej.line}: {rej.reason}",
            raw=rej.raw,
        )

    def _reject(
        self,
        prompt: Prompt,
        stage: str,
        code: str,
        reason: str,
        prompt_ids: list[int] | None = None,
    ) -> Reject:
        return Reject(
            partition=self.partition.name,
            source_file=self.partition.input,
            source_line=prompt.line,
            id=prompt.id,
            stage=stage,
            reason_code=code,
            reason=reason,
            prompt_ids=prompt_ids,
        )
