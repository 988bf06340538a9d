"""What a partition run needs before its first request: tokenizer, ids, batches, window, and an
output directory that describes the current input (superseded batches moved out, earlier
results indexed for reuse: see ``write/resume.py``)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from eagle3_datagen.config import PipelineConfig
from eagle3_datagen.inputs.prompts import BatchSpec
from eagle3_datagen.inputs.scan import InputInfo, scan_input
from eagle3_datagen.render.chat_tokenizer import ChatTokenizer
from eagle3_datagen.render.token_ids import TokenIds
from eagle3_datagen.write.resume import ReusePool, done_lines, prepare_partition
from eagle3_datagen.write.shards import PartitionOutput


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
    and bring the partition's output directory in line with the input as it is now.

    The input is streamed (batches are byte ranges), so this holds no prompt in memory.
    """
    part = config.partition(partition)
    tier = config.tier(part.tier)
    tokenizer = load_tokenizer(config)
    scan = scan_input(partition, part.input, config.batch_size)
    output = PartitionOutput(config.output_dir, partition)
    reuse, superseded = prepare_partition(output, scan.batches, scan.info)
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
    )
