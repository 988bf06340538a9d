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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from eagle3_datagen.config import PipelineConfig, Tier
from eagle3_datagen.errors import (
    BatchFailed,
    DatagenError,
    RejectedRequestError,
    RetriesExhaustedError,
    ServerError,
)
from eagle3_datagen.generate import gc_tuning, offload
from eagle3_datagen.generate.conversation import (
    STOP_REJECTED,
    STOP_TOOL_CALL,
    STOP_TRUNCATED,
    continue_history,
    first_turn,
    plan_turns,
    record_id,
    served_turn,
    tool_call_divergence,
)
from eagle3_datagen.generate.media import TurnImages, turn_images
from eagle3_datagen.generate.offload import JournalWriter, off_loop
from eagle3_datagen.generate.plan import PartitionPlan
from eagle3_datagen.inputs.prompts import BatchSpec, InputReject, Prompt, parse_prompt, read_batch
from eagle3_datagen.render.chat_tokenizer import ChatTokenizer, RenderError
from eagle3_datagen.render.token_ids import TokenIds
from eagle3_datagen.report.progress import Progress
from eagle3_datagen.sglang.budget import ServerBudget
from eagle3_datagen.sglang.client import GenerateResult, SGLangClient, request_id
from eagle3_datagen.sglang.pool import ServerPool, connect
from eagle3_datagen.sglang.preflight import length_rejection
from eagle3_datagen.sglang.requests import GenerateClient, generate_with_retries
from eagle3_datagen.sglang.supervisor import ServerSupervisor
from eagle3_datagen.validate.tokens import ToolCallCheck, Verdict, validate_output
from eagle3_datagen.write.journal import BatchJournal, prompt_key
from eagle3_datagen.write.records import Record, Reject
from eagle3_datagen.write.resume import Prior, ReusePool
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
            reuse=plan.reuse,
            **options,
        )

    async def run_batch(self, spec: BatchSpec) -> BatchSummary:
        """Process one batch end to end, or return its summary if it was committed before.

        A failure no retry can fix (``errors.final_cause``) stops the whole run: every
        partition, at once (``ServerSupervisor.stop``). A failed attempt's settled lines stop
        counting as done: progress counts what is on disk and in flight, not what a failed
        batch will redo."""
        try:
            return await self._run_batch(spec)
        except BaseException as err:
            self.progress.batch_failed(spec.index)
            if isinstance(err, Exception) and self.supervisor is not None:
                self.supervisor.stop(err)
            raise

    async def _run_batch(self, spec: BatchSpec) -> BatchSummary:
        """Reading and rendering the batch, its journal and its Parquet write run on worker
        threads (``generate/offload.py``): the event loop only sends, receives and validates."""
        self.raise_if_server_lost()
        self.progress.attempt(spec.index)
        self._batch_run[spec.index] = f"{self.run_id}-{secrets.token_hex(2)}"
        done = self.output.committed(spec.index, spec.key)
        if done is not None:
            self.progress.batch_skipped(done.lines)
            return done
        t0 = time.monotonic()
        jobs, rejects, earlier = await off_loop(self._prepare, spec)
        self.progress.batch_started(spec.index, spec.count - len(jobs))
        try:
            outcomes = await self._run_conversations(spec.index, jobs, earlier)
            await earlier.writer.drain()  # a journal write that failed fails the batch
        finally:
            await earlier.writer.close()
        summary, records = summarize_batch(spec, outcomes, rejects)
        summary.wall_s = round(time.monotonic() - t0, 3)
        await off_loop(self._commit, summary, records, rejects, earlier.journal)
        self.progress.batch_committed(
            spec.index,
            lines=spec.count,
            accepted=summary.accepted,
            rejected=summary.rejected,
            truncated=summary.truncated,
            rejects_by_reason=summary.rejects_by_reason,
        )
        return summary

    def _prepare(self, spec: BatchSpec) -> tuple[list[_Job], list[Reject], _Earlier]:
        """On a worker thread: the batch's lines parsed, first turns rendered, each line a job
        or a reject, and what earlier attempts left (the journal, superseded results)."""
        rejects: list[Reject] = []
        prompts: list[Prompt] = []
        image_dir = Path(spec.path).parent  # relative image paths are the input file's
        for line, raw in read_batch(spec):
            parsed = parse_prompt(raw, line, image_dir)
            if isinstance(parsed, InputReject):
                rejects.append(self._input_reject(parsed))
            else:
                prompts.append(parsed)
        # The first turn of every line is rendered in one call (later turns depend on the
        # model's earlier ones and are rendered as their conversation gets there).
        firsts = [first_turn(p, self.partition.regenerate) for p in prompts]
        rendered = offload.render(self.tokenizer, firsts) if prompts else []
        jobs: list[_Job] = []
        for prompt, turn0, ids in zip(prompts, firsts, rendered, strict=True):
            first = self.duplicates.get(prompt.line)
            if first is not None:
                reason = f"id {prompt.id!r} already used on line {first}"
                rejects.append(self._reject(prompt, "input", "duplicate_id", reason))
            elif isinstance(ids, RenderError):
                rejects.append(self._reject(prompt, "template", "template_error", ids.reason))
            # The first turn's own images: with all_turns a line's images may come later.
            elif isinstance(media := self._images(turn0, ids), str):
                rejects.append(self._reject(prompt, "template", "image_mismatch", media, ids))
            elif too_long := self._too_long(len(media.expanded if media else ids)):
                rejects.append(self._reject(prompt, "input", "prompt_too_long", too_long, ids))
            else:
                jobs.append(_Job(prompt, ids, len(media.expanded if media else ids)))
        samples = self.partition.samples
        # First turns are prefetched from superseded batches in one pass; with none (the usual
        # case) their keys are not worth hashing twice (each turn hashes its own in _turn).
        first_keys = (
            [
                prompt_key(self._record_id(job.prompt, 0, n), job.ids)
                for job in jobs
                for n in range(samples)
            ]
            if len(self.reuse)
            else []
        )
        journal = BatchJournal(self.output.journal_path(spec.index))
        return jobs, rejects, _Earlier(journal, self.reuse, first_keys)

    def _commit(
        self,
        summary: BatchSummary,
        records: list[Record],
        rejects: list[Reject],
        journal: BatchJournal,
    ) -> None:
        """On a worker thread: the batch's Parquet files and commit marker (with their fsync);
        then its journal goes, the marker now standing for these results."""
        records.sort(key=lambda r: r.source_line)
        rejects.sort(key=lambda r: r.source_line)
        self.output.write_batch(summary, records, rejects, self.metadata)
        journal.remove()

    async def _run_conversations(
        self, index: int, jobs: list[_Job], earlier: _Earlier
    ) -> list[_Outcome]:
        """Every conversation of the batch (each line, each sample) at once; the turns of one
        conversation one after another. A line counts as done when all its samples are.

        If one request fails for good, the others are cancelled and the batch fails; what
        finished stays in the journal for the retry.

        Longest first: the conversations queue for the tier's slots (and the server budget) in
        order of their prompt length, longest first: the one length known before the answer
        (a longer prompt holds more KV and costs more per output token), so the batch ends
        with its cheapest requests. The length is the one the server holds: an image prompt's
        ids with each placeholder expanded (``_Job.seen``). Outcomes come back in line order.
        """
        samples = self.partition.samples
        left = {job.prompt.line: samples for job in jobs}

        async def one(prompt: Prompt, ids: list[int], sample: int) -> _Outcome:
            outcome = await self._conversation(index, prompt, ids, sample, earlier)
            left[prompt.line] -= 1
            if not left[prompt.line]:
                self.progress.line_done(index)
            return outcome

        # sorted() is stable: prompts of one length keep their line order.
        order = sorted(range(len(jobs)), key=lambda j: -jobs[j].seen)
        tasks: list[asyncio.Task[_Outcome] | None] = [None] * (len(jobs) * samples)
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

    def _record_id(self, prompt: Prompt, turn: int, sample: int) -> str:
        return record_id(
            prompt.id,
            turn,
            sample,
            turns=self.partition.regenerate == "all_turns",
            samples=self.partition.samples,
        )

    def _sampling(self, rec_id: str, temperature: float) -> dict[str, Any]:
        """The request's sampling: the sample's temperature, the record's own seed."""
        sampling = self.sampling
        if temperature != sampling["temperature"]:
            sampling = {**sampling, "temperature": temperature}
        if (seed := self.config.sampling.request_seed(rec_id)) is not None:
            sampling = {**sampling, "sampling_seed": seed}  # one seed per record
        return sampling

    async def _conversation(
        self, index: int, prompt: Prompt, first_ids: list[int], sample: int, earlier: _Earlier
    ) -> _Outcome:
        """One sample of one line: its turns in order, each on the model's own earlier turns
        (generate/conversation.py). Ends at the last turn, or where a turn is rejected, cut at
        max_tokens, or calls tools other than the data's."""
        slots = plan_turns(prompt, self.partition.regenerate)
        temperature = self.partition.temperature(sample, self.config.sampling.temperature)
        out = _Outcome()
        history = prompt.messages[: slots[0].history_end]
        ids = first_ids
        for pos, slot in enumerate(slots):
            rec_id = self._record_id(prompt, slot.index, sample)
            at = TurnAt(rec_id, slot.index, sample)
            if pos:
                turn_prompt = Prompt(rec_id, prompt.line, history, prompt.tools, prompt.images)
                rendered = (await off_loop(offload.render, self.tokenizer, [turn_prompt]))[0]
                if isinstance(rendered, RenderError):
                    out.end(
                        self._reject(prompt, "template", "template_error", rendered.reason, at=at)
                    )
                    break
                ids = rendered
                turn_media = self._images(turn_prompt, ids)
                if isinstance(turn_media, str):
                    out.end(
                        self._reject(prompt, "template", "image_mismatch", turn_media, ids, at=at)
                    )
                    break
                too_long = self._too_long(len(turn_media.expanded if turn_media else ids))
                if too_long:
                    out.end(self._reject(prompt, "input", "prompt_too_long", too_long, ids, at=at))
                    break
            sampling = self._sampling(rec_id, temperature)
            media = self._images(
                Prompt(rec_id, prompt.line, history, prompt.tools, prompt.images), ids
            )
            assert not isinstance(media, str)  # checked when the turn was rendered
            record = await self._turn(index, prompt, ids, sampling, earlier, out, at, media)
            if record is None:
                break
            out.records.append(record)
            if pos + 1 == len(slots):
                break
            if record.truncated:
                record.stop_reason = f"{STOP_TRUNCATED}: the turn reached max_tokens"
                out.stop = STOP_TRUNCATED
                break
            message, calls = served_turn(
                self.tokenizer, history, prompt.tools, ids, record.output_ids, record.finish_reason
            )
            diverged = tool_call_divergence(slot.data, calls)
            if diverged is not None:
                record.stop_reason = f"{STOP_TOOL_CALL}: {diverged}"
                out.stop = STOP_TOOL_CALL
                break
            history = continue_history(
                history, message, calls or [], slot, slots[pos + 1], prompt.messages
            )
        if out.stop is None and out.rejects and len(out.records) + 1 < len(slots):
            out.stop = STOP_REJECTED
        return out

    async def _turn(
        self,
        index: int,
        prompt: Prompt,
        ids: list[int],
        sampling: dict[str, Any],
        earlier: _Earlier,
        out: _Outcome,
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
            out.end(
                dataclasses.replace(
                    found, source_line=prompt.line, source_file=self.partition.input
                )
            )
            return None
        result = found
        if result is None:
            suffix = at.id[len(prompt.id) :]
            result, error = await self._generate(index, prompt, ids, sampling, suffix, media)
            out.sent += 1
            if result is None:
                out.end(self._reject(prompt, "server", "server_rejected", error or "", ids, at=at))
                return None
            earlier.add(key, result)
        seen = media.expanded if media else ids  # what the model saw and the server counted
        verdict = validate_output(
            seen,
            result.output_ids,
            finish_type=result.finish_type,
            finish_matched=result.finish_matched,
            prompt_tokens=result.prompt_tokens,
            completion_tokens=result.completion_tokens,
            ids=self.ids,
            policy=self.config.validation,
            tool_check=ToolCallCheck(self.tokenizer.decode, prompt.tools),
        )
        if not verdict.accepted:
            out.end(
                Reject(
                    partition=self.partition.name,
                    source_file=self.partition.input,
                    source_line=prompt.line,
                    id=at.id,
                    stage="validation",
                    reason_code=verdict.reasons[0][0],
                    reason=verdict.reason_text,
                    prompt_ids=ids,
                    output_ids=result.output_ids,
                    finish_reason=result.finish_type,
                    turn=at.turn,
                    sample=at.sample,
                )
            )
            return None
        return self._record(prompt, ids, media, result, verdict, sampling, at)

    def _record(
        self,
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
            partition=self.partition.name,
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
        )

    def _images(self, prompt: Prompt, ids: list[int]) -> TurnImages | str | None:
        """The turn's images (None for a text prompt or a turn without images), or why they do
        not fit its ids."""
        return turn_images(self.tokenizer, prompt, ids) if prompt.images else None

    def raise_if_server_lost(self) -> None:
        """A batch must not start once the run has stopped (the server gone for good, or any
        other cause no retry can fix): it raises the stopping cause's error."""
        if self.supervisor is not None:
            self.supervisor.raise_if_stopped()

    def _too_long(self, prompt_len: int) -> str | None:
        if self.context_length is None:
            return None
        reason = length_rejection(
            prompt_len, self.tier.max_tokens, self.context_length, self.max_req_input_len
        )
        return reason.removeprefix("prompt_too_long: ") if reason else None

    async def _generate(
        self,
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
        try:
            result = await generate_with_retries(
                self.client,
                prompt_ids,
                sampling,
                rid=functools.partial(
                    request_id,
                    self._batch_run[index],
                    self.partition.name,
                    f"{prompt.line}{suffix}",
                ),
                policy=self.config.retries,
                reserve_tokens=len(media.expanded if media else prompt_ids) + self.tier.max_tokens,
                image_data=media.image_data() if media else None,
                slots=self.semaphore,
                supervisor=self.supervisor,
                budget=self.budget,
                share=self.partition.name,
                on_retry=self._count_retry,
            )
        except RejectedRequestError as err:
            return None, str(err)
        except (ServerError, RetriesExhaustedError) as err:
            where = f"partition {self.partition.name}, line {prompt.line}"
            raise BatchFailed(f"{where}: {err}") from err
        self.progress.output_tokens += len(result.output_ids)
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
        *,
        at: TurnAt | None = None,
    ) -> Reject:
        """A reject of the line (``at`` None) or of one turn of one of its conversations."""
        return Reject(
            partition=self.partition.name,
            source_file=self.partition.input,
            source_line=prompt.line,
            id=at.id if at is not None else prompt.id,
            stage=stage,
            reason_code=code,
            reason=reason,
            prompt_ids=prompt_ids,
            turn=at.turn if at is not None else None,
            sample=at.sample if at is not None else None,
        )


@dataclass(frozen=True, slots=True)
class _Job:
    """A line to run: its first turn's ids as sent, and the length the model sees (the ids
    with each image placeholder expanded; the ids' own length for a text prompt)."""

    prompt: Prompt
    ids: list[int]
    seen: int


@dataclass(frozen=True, slots=True)
class TurnAt:
    """Which record a turn makes: its id, turn index and sample index."""

    id: str
    turn: int
    sample: int


@dataclass(slots=True)
class _Outcome:
    """What one conversation left: its records, the reject that ended it, requests sent, and
    why it stopped before its last turn (None: it did not)."""

    records: list[Record] = field(default_factory=list)
    rejects: list[Reject] = field(default_factory=list)
    sent: int = 0
    stop: str | None = None

    def end(self, reject: Reject) -> None:
        self.rejects.append(reject)


class _Earlier:
    """What earlier attempts and runs left for this batch's requests, by prompt key (the
    record's id and its prompt ids; nothing is matched by line number, the input may have
    changed since): this batch's journal, then the results of superseded batches. First turns
    are looked up together (one file read per superseded shard); a later turn's prompt is only
    known once the turn before it is, so it is looked up alone. A result found in another
    batch's journal is copied into this one's, so it outlives that journal."""

    def __init__(self, journal: BatchJournal, reuse: ReusePool, first_keys: list[int]) -> None:
        self.journal = journal
        self.writer = JournalWriter(journal)
        self.journaled = journal.load()
        self.reuse = reuse
        missing = [k for k in first_keys if k not in self.journaled]
        self.prefetched = reuse.take(missing) if missing and len(reuse) else {}

    def find(self, key: int) -> Prior | None:
        found: Prior | None = self.journaled.get(key)
        if found is not None:
            return found
        if key in self.prefetched:
            found = self.prefetched[key]
        elif len(self.reuse):
            found = self.reuse.take([key]).get(key)
        if isinstance(found, GenerateResult):
            self.add(key, found)
        return found

    def add(self, key: int, result: GenerateResult) -> None:
        """Journal a finished result: written by a worker thread; a write that failed (a full
        disk) raises OutputWriteError here or when the batch drains its journal."""
        self.writer.add(key, result)
        self.journaled[key] = result


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


def summarize_batch(
    spec: BatchSpec, outcomes: list[_Outcome], rejects: list[Reject]
) -> tuple[BatchSummary, list[Record]]:
    """The batch's summary and records from its conversations' outcomes (``rejects`` gets
    theirs); a batch in which an input line has neither a record nor a reject is refused."""
    summary = BatchSummary(spec.partition, spec.index, spec.first_line, spec.count)
    records: list[Record] = []
    for outcome in outcomes:
        records.extend(outcome.records)
        rejects.extend(outcome.rejects)
        summary.requests_sent += outcome.sent
        if outcome.stop is not None:
            summary.stopped += 1
            summary.stops_by_reason[outcome.stop] = summary.stops_by_reason.get(outcome.stop, 0) + 1
    summary.conversations = len(outcomes)
    add_record_counts(summary, records)
    summary.records_by_turn = dict(Counter(str(record.turn) for record in records))
    summary.accepted = len(records)
    summary.rejected = len(rejects)
    summary.rejects_by_reason = dict(Counter(r.reason_code for r in rejects))
    covered = {r.source_line for r in records} | {r.source_line for r in rejects}
    lost = [
        line for line in range(spec.first_line, spec.first_line + spec.count) if line not in covered
    ]
    if lost or len(covered) != spec.count:
        raise BatchFailed(
            f"{spec.label}: {spec.count} input lines but {len(lost)} without a record or a "
            f"reject (first: line {lost[0] if lost else '?'}); refusing to commit a batch "
            "that lost lines"
        )
    summary.input_key = spec.key
    return summary, records


def add_record_counts(summary: BatchSummary, records: list[Record]) -> None:
    """Add the records' truncations, token counts and lengths to their batch's summary."""
    for record in records:
        summary.truncated += record.truncated
        summary.prompt_tokens += len(record.prompt_ids)
        summary.output_tokens += len(record.output_ids)
        summary.output_lengths.append(len(record.output_ids))
        if record.think_end_index >= 0:
            summary.thinking_lengths.append(record.think_end_index)


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
