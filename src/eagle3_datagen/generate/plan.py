"""What a partition run needs before its first request: tokenizer, ids, batches, window, and an
output directory that describes the current input (superseded batches moved out, earlier
results indexed for reuse: see ``write/resume.py``)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import orjson

from eagle3_datagen.config import PipelineConfig
from eagle3_datagen.generate.kwargs_probe import check_kwargs
from eagle3_datagen.inputs.near_dups import Similar
from eagle3_datagen.inputs.prompts import BatchSpec
from eagle3_datagen.inputs.scan import InputInfo, scan_input
from eagle3_datagen.render.chat_tokenizer import ChatTokenizer
from eagle3_datagen.render.token_ids import TokenIds
from eagle3_datagen.write.resume import ReusePool, done_lines, prepare_partition
from eagle3_datagen.write.shards import PartitionOutput, atomic_write_bytes

NEAR_DUPLICATES = "near_duplicates.jsonl"  # in the partition's directory


@dataclass(slots=True)
class PartitionPlan:
    """A partition's batches (byte ranges), its repeated ids, and how many batches run at once."""

    tokenizer: ChatTokenizer
    ids: TokenIds
    batches: list[BatchSpec]
    duplicates: dict[int, int]  # line -> earlier line with the same id
    window: int  # batches in flight at once
    input: InputInfo  # path, size, SHA-256 and line count of the input, for the manifest
    reuse: ReusePool  # earlier results of prompts whose batch was superseded
    superseded: list[int]  # indexes of committed batches that no longer match the input
    done_lines: int  # lines of batches earlier runs committed from the input as it is now
    similar: list[Similar]  # prompts that repeat an earlier line's (inputs/near_dups.py)
    dropped: dict[int, Similar]  # those the partition's policy drops, by line
    # Why the template refuses a line's kwargs, by kwargs_key (mode named, own kwargs): those
    # lines are rejected as bad input (generate/kwargs_probe.py)
    refused_kwargs: dict[str, str]

    @property
    def total_lines(self) -> int:
        return sum(b.count for b in self.batches)


def load_tokenizer(config: PipelineConfig) -> ChatTokenizer:
    """The model's tokenizer and chat template, as the config describes them."""
    return ChatTokenizer(
        config.model.tokenizer_dir,
        trust_remote_code=config.model.trust_remote_code,
        chat_template_kwargs=config.model.chat_template_kwargs,
        render=config.model.render,
    )


def plan_partition(config: PipelineConfig, partition: str) -> PartitionPlan:
    """Load the tokenizer, resolve the special tokens, plan the batches, find duplicate ids,
    try the template on every kwargs set the partition uses (``kwargs_probe``: a refused mode
    stops here, a refused line's kwargs reject that line), and bring the
    partition's output directory in line with the input as it is now.

    The input is streamed (batches are byte ranges), so this holds no prompt in memory.
    """
    part = config.partition(partition)
    tier = config.tier(part.tier)
    tokenizer = load_tokenizer(config)
    scan = scan_input(
        partition, part.input, config.batch_size, part.near_duplicates, config.model.modes
    )
    refused = check_kwargs(tokenizer, config.model.modes, part.modes, scan.kwargs_lines)
    output = PartitionOutput(config.output_dir, partition)
    reuse, superseded = prepare_partition(output, scan.batches, scan.info)
    write_similar(output, str(part.input), scan.similar)
    return PartitionPlan(
        tokenizer=tokenizer,
        ids=TokenIds.resolve(tokenizer, config.special_tokens),
        batches=scan.batches,
        duplicates=scan.duplicates,
        # Enough batches in flight to keep the tier's slots full across batch boundaries.
        window=max(2, math.ceil(tier.in_flight_cap / config.batch_size) + 1),
        input=scan.info,
        reuse=reuse,
        superseded=superseded,
        done_lines=done_lines(output, scan.batches),
        similar=scan.similar,
        dropped=scan.dropped,
        refused_kwargs=refused,
    )


def write_similar(output: PartitionOutput, path: str, similar: list[Similar]) -> None:
    """``near_duplicates.jsonl``: one line per repeated prompt (file, line, first line, kind,
    similarity), rewritten by every scan so it describes the input as it is now."""
    output.dir.mkdir(parents=True, exist_ok=True)
    data = b"".join(orjson.dumps(s.to_json(path)) + b"\n" for s in similar)
    atomic_write_bytes(output.dir / NEAR_DUPLICATES, data)
