"""What a partition run needs before its first request: tokenizer, ids, batches, window."""

from __future__ import annotations

import math
from dataclasses import dataclass

from eagle3_datagen.config import PipelineConfig
from eagle3_datagen.inputs.prompts import BatchSpec, find_duplicate_ids, plan_batches
from eagle3_datagen.render.chat_tokenizer import ChatTokenizer
from eagle3_datagen.validate.tokens import TokenIds


@dataclass(slots=True)
class PartitionPlan:
    """A partition's batches (byte ranges), its repeated ids, and how many batches run at once."""

    tokenizer: ChatTokenizer
    ids: TokenIds
    batches: list[BatchSpec]
    duplicates: dict[int, int]  # line -> earlier line with the same id
    window: int  # batches in flight at once

    @property
    def total_lines(self) -> int:
        return sum(b.count for b in self.batches)


def load_tokenizer(config: PipelineConfig) -> ChatTokenizer:
    """The model's tokenizer and chat template, as the config describes them."""
    return ChatTokenizer(
        config.model.tokenizer_dir,
        trust_remote_code=config.model.trust_remote_code,
        chat_template_kwargs=config.model.chat_template_kwargs,
    )


def plan_partition(config: PipelineConfig, partition: str) -> PartitionPlan:
    """Load the tokenizer, resolve the special tokens, plan the batches, find duplicate ids.

    The input is streamed (batches are byte ranges), so this holds no prompt in memory.
    """
    part = config.partition(partition)
    tier = config.tier(part.tier)
    tokenizer = load_tokenizer(config)
    return PartitionPlan(
        tokenizer=tokenizer,
        ids=TokenIds.resolve(tokenizer, config.special_tokens),
        batches=list(plan_batches(partition, part.input, config.batch_size)),
        duplicates=find_duplicate_ids(partition, part.input),
        # Enough batches in flight to keep the tier's slots full across batch boundaries.
        window=max(2, math.ceil(tier.concurrency / config.batch_size) + 1),
    )
