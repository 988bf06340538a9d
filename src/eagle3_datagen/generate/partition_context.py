"""What every batch of one partition reads and never changes: its partition and tier, the
tokenizer and special ids, the sampling, modes and validation policy, the lines to reject, the
reusable results, where it writes and where it counts. Built once per partition; the batch's
steps (prepare, converse, turn) take it instead of the runner that holds it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from eagle3_datagen.config import Partition, Sampling, Tier, ValidationPolicy
from eagle3_datagen.generate.context import PartitionJob
from eagle3_datagen.generate.conversation import record_id
from eagle3_datagen.generate.media import TurnImages, turn_images
from eagle3_datagen.inputs.near_dups import Similar
from eagle3_datagen.inputs.prompts import Prompt
from eagle3_datagen.render.chat_tokenizer import ChatTokenizer
from eagle3_datagen.render.token_ids import TokenIds
from eagle3_datagen.report.progress import Progress
from eagle3_datagen.sglang.preflight import length_rejection
from eagle3_datagen.write.resume import ReusePool
from eagle3_datagen.write.shards import PartitionOutput


@dataclass(frozen=True, slots=True)
class PartitionContext:
    """One partition's fixed parts. ``sampling`` is the tier's request sampling as SGLang takes
    it; ``seeds`` the config's sampling (default temperature, per-record seeds);
    ``duplicates``: line -> the earlier line with the same id; ``dropped``: line -> the earlier
    prompt it repeats (the near_duplicates drop policy); ``context_length`` and
    ``max_req_input_len``: the server's limits (None: unknown, nothing rejected for length)."""

    partition: Partition
    tier: Tier
    tokenizer: ChatTokenizer
    ids: TokenIds
    sampling: dict[str, Any]
    seeds: Sampling
    modes: Mapping[str, Mapping[str, Any]]
    validation: ValidationPolicy
    output: PartitionOutput
    progress: Progress = field(default_factory=Progress)
    duplicates: Mapping[int, int] = field(default_factory=dict)
    dropped: Mapping[int, Similar] = field(default_factory=dict)
    reuse: ReusePool = field(default_factory=ReusePool)
    context_length: int | None = None
    max_req_input_len: int | None = None
    # Why the template refuses a line's kwargs, by inputs.scan.kwargs_key: those lines are
    # rejected as bad input (generate/kwargs_probe.py)
    refused_kwargs: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def build(
        cls,
        job: PartitionJob,
        tokenizer: ChatTokenizer,
        ids: TokenIds,
        duplicates: Mapping[int, int] | None = None,
        dropped: Mapping[int, Similar] | None = None,
        reuse: ReusePool | None = None,
        refused_kwargs: Mapping[str, str] | None = None,
    ) -> PartitionContext:
        """The context of ``job``'s partition: its config's parts, the server's limits the job
        carries, the lines to reject (repeated, dropped, kwargs the template refuses) and the
        results to reuse (a plan's, generate/plan.py)."""
        config = job.config
        part = config.partition(job.partition)
        tier = config.tier(part.tier)
        sampling = config.sampling.to_sglang(tier.max_tokens, list(ids.stop_ids))
        return cls(
            *(part, tier, tokenizer, ids, sampling, config.sampling, config.model.modes),
            *(config.validation, PartitionOutput(config.output_dir, part.name), Progress()),
            *(duplicates or {}, dropped or {}, reuse or ReusePool()),
            *(job.context_length, job.max_req_input_len),
            refused_kwargs=refused_kwargs or {},
        )

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

    def temperature(self, sample: int) -> float:
        """The temperature of sample ``sample`` (the partition's, or the config's)."""
        return self.partition.temperature(sample, self.seeds.temperature)

    def turn_sampling(self, rec_id: str, temperature: float) -> dict[str, Any]:
        """The request's sampling: the sample's temperature, the record's own seed."""
        sampling = self.sampling
        if temperature != sampling["temperature"]:
            sampling = {**sampling, "temperature": temperature}
        if (seed := self.seeds.request_seed(rec_id)) is not None:
            sampling = {**sampling, "sampling_seed": seed}  # one seed per record
        return sampling
