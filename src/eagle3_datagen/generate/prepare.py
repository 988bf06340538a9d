"""A batch's first step, on a worker thread: its lines parsed, their first turns rendered, each
line a job or a reject, and what earlier attempts left for it (journal, superseded results)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from eagle3_datagen.config import Partition
from eagle3_datagen.generate import offload
from eagle3_datagen.generate.conversation import first_turn
from eagle3_datagen.generate.earlier import Earlier
from eagle3_datagen.generate.partition_context import PartitionContext
from eagle3_datagen.generate.rejects import input_reject, turn_reject
from eagle3_datagen.inputs.modes import apply_mode
from eagle3_datagen.inputs.near_dups import Similar
from eagle3_datagen.inputs.prompts import (
    BatchSpec,
    InputReject,
    Prompt,
    parse_prompt,
    raw_text,
    read_batch,
)
from eagle3_datagen.inputs.scan import kwargs_key
from eagle3_datagen.render.chat_tokenizer import RenderError
from eagle3_datagen.write.journal import BatchJournal, prompt_key
from eagle3_datagen.write.records import Reject


@dataclass(frozen=True, slots=True)
class Job:
    """A line to run: its first turn's ids as sent, and the length the model sees (the ids
    with each image placeholder expanded; the ids' own length for a text prompt)."""

    prompt: Prompt
    ids: list[int]
    seen: int


def prepare_batch(
    ctx: PartitionContext, spec: BatchSpec
) -> tuple[list[Job], list[Reject], Earlier]:
    """On a worker thread: the batch's lines parsed, first turns rendered, each line a job
    or a reject, and what earlier attempts left (the journal, superseded results)."""
    prompts, rejects = _parse(ctx, spec)
    jobs = _first_turns(ctx, prompts, rejects)
    samples = ctx.partition.samples
    # First turns are prefetched from superseded batches in one pass; with none (the usual
    # case) their keys are not worth hashing twice (each turn hashes its own in run_turn).
    first_keys = (
        [
            prompt_key(ctx.record_id(job.prompt, 0, n), job.ids)
            for job in jobs
            for n in range(samples)
        ]
        if len(ctx.reuse)
        else []
    )
    journal = BatchJournal(ctx.output.journal_path(spec.index))
    return jobs, rejects, Earlier(journal, ctx.reuse, first_keys)


def _parse(ctx: PartitionContext, spec: BatchSpec) -> tuple[list[Prompt], list[Reject]]:
    """The batch's lines as prompts, and a reject for each line that is none."""
    rejects: list[Reject] = []
    prompts: list[Prompt] = []
    image_dir = Path(spec.path).parent  # relative image paths are the input file's
    modes, shares = ctx.modes, ctx.partition.modes
    refused = ctx.refused_kwargs
    for line, raw in read_batch(spec):
        parsed = parse_prompt(raw, line, image_dir)
        if isinstance(parsed, Prompt) and refused and (parsed.mode or parsed.kwargs):
            why = refused.get(kwargs_key(parsed.mode, parsed.kwargs))
            if why is not None:  # its kwargs, as the plan's probe found (kwargs_probe.py)
                parsed = InputReject(line, why, "", parsed.id)
        if isinstance(parsed, Prompt):
            parsed = apply_mode(parsed, modes, shares)
        if isinstance(parsed, InputReject):
            parsed.raw = parsed.raw or raw_text(raw)
            rejects.append(input_reject(ctx.partition, parsed))
        else:
            prompts.append(parsed)
    return prompts, rejects


def _first_turns(ctx: PartitionContext, prompts: list[Prompt], rejects: list[Reject]) -> list[Job]:
    """Each prompt's first turn rendered: a job, or a reject added to ``rejects`` (a repeated
    id, a template error, images that do not fit, a prompt too long for the server)."""
    partition = ctx.partition
    # The first turn of every line is rendered in one call (later turns depend on the
    # model's earlier ones and are rendered as their conversation gets there).
    firsts = [first_turn(p, partition.regenerate) for p in prompts]
    rendered = offload.render(ctx.tokenizer, firsts) if prompts else []
    jobs: list[Job] = []
    for prompt, turn0, ids in zip(prompts, firsts, rendered, strict=True):
        first = ctx.duplicates.get(prompt.line)
        if first is not None:
            reason = f"id {prompt.id!r} already used on line {first}"
            rejects.append(turn_reject(partition, prompt, "input", "duplicate_id", reason))
        elif (similar := ctx.dropped.get(prompt.line)) is not None:
            rejects.append(repeated_prompt(partition, prompt, similar))
        elif isinstance(ids, RenderError):
            rejects.append(turn_reject(partition, prompt, "template", "template_error", ids.reason))
        # The first turn's own images: with all_turns a line's images may come later.
        elif isinstance(media := ctx.images(turn0, ids), str):
            rejects.append(turn_reject(partition, prompt, "template", "image_mismatch", media, ids))
        elif too_long := ctx.too_long(len(media.expanded if media else ids)):
            rejects.append(
                turn_reject(partition, prompt, "input", "prompt_too_long", too_long, ids)
            )
        else:
            jobs.append(Job(prompt, ids, len(media.expanded if media else ids)))
    return jobs


def repeated_prompt(partition: Partition, prompt: Prompt, similar: Similar) -> Reject:
    """The reject of a line the ``drop`` policy drops: it repeats line ``similar.first``."""
    if similar.kind == "exact":
        code, how = "duplicate_prompt", "the same prompt as"
    else:
        code, how = "near_duplicate", f"a near duplicate ({similar.similarity:.2f}) of"
    reason = f"{how} line {similar.first} (near_duplicates policy: drop)"
    return turn_reject(partition, prompt, "input", code, reason)
