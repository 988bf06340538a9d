"""Which conversations a selection keeps: every committed record read once (only the columns
the rule needs), summed per conversation, ranked by the rule, the top fraction kept.

Conversations stay whole: all turns and samples of one input line (partition +
``conversation_id``, the key the held-out split uses too) are kept or dropped together. Each
partition keeps its own fraction, so the selection does not change the partitions' mix.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import pyarrow.compute as pc
import pyarrow.parquet as pq

from eagle3_datagen.errors import DatasetError
from eagle3_datagen.select.rules import Rule, Tally, rule_named, tie_break
from eagle3_datagen.write.dataset_dir import DatasetDir, Shard, iter_rows


@dataclass(slots=True)
class PartitionChoice:
    """One partition's ranking: its conversations, the kept ones, those the rule could not
    score (they rank after every scored one)."""

    conversations: int = 0
    unscored: int = 0
    kept: set[str] = field(default_factory=set)
    kept_scores: tuple[float, float] | None = None  # (lowest, highest) score kept

    def to_dict(self) -> dict[str, Any]:
        return {
            "conversations": self.conversations,
            "kept": len(self.kept),
            "unscored": self.unscored,
            "kept_score_range": list(self.kept_scores) if self.kept_scores else None,
        }


def committed_shards(ds: DatasetDir) -> dict[str, list[Shard]]:
    """Each partition's committed shards; a dataset with uncommitted or missing shards is
    refused (select what a finished run wrote)."""
    out: dict[str, list[Shard]] = {}
    for name in ds.partitions():
        shards, problems = ds.shards(name)
        if problems:
            raise DatasetError(f"{ds.root} is not a finished dataset: {problems[0]}")
        out[name] = shards
    return out


def has_column(shards: dict[str, list[Shard]], column: str) -> bool:
    """Whether some committed record holds a value of ``column``."""
    for part in shards.values():
        for shard in part:
            pf = pq.ParquetFile(shard.path)
            if column not in pf.schema_arrow.names or not pf.metadata.num_rows:
                continue
            values = pf.read(columns=[column]).column(column)
            if values.null_count < len(values):
                return True
    return False


def _group_column(shard: Shard) -> str:
    """``conversation_id``; shards of versions before it have one record per line (``id``)."""
    names = pq.ParquetFile(shard.path).schema_arrow.names
    return "conversation_id" if "conversation_id" in names else "id"


def tally(shards: list[Shard], rule: Rule) -> dict[str, Tally]:
    """Each conversation's sums over its records."""
    groups: dict[str, Tally] = {}
    for shard in shards:
        key = _group_column(shard)
        names = pq.ParquetFile(shard.path).schema_arrow.names
        columns = [key, "completion_tokens", *(c for c in _read(rule) if c in names)]
        for row in iter_rows(shard.path, list(dict.fromkeys(columns))):
            groups.setdefault(row[key], Tally()).add(row)
    return groups


def _read(rule: Rule) -> tuple[str, ...]:
    """The stored columns a rule's tally reads (the score's inputs and their weights)."""
    extra = {
        "spec_verify_ct": ("spec_num_correct_drafts", "spec_num_proposed_drafts"),
        "spec_num_correct_drafts": ("spec_num_proposed_drafts", "spec_verify_ct"),
    }
    out = list(rule.columns)
    for c in rule.columns:
        out.extend(extra.get(c, ()))
    return tuple(out)


def keep_count(fraction: float, groups: int) -> int:
    """Conversations kept of ``groups``: the fraction rounded half up, at least one."""
    if not groups:
        return 0
    return min(groups, max(1, math.floor(fraction * groups + 0.5)))


def choose(
    partition: str, groups: dict[str, Tally], rule: Rule, fraction: float, seed: int
) -> PartitionChoice:
    """Rank the conversations (score high to low, unscored last, ties by a seeded hash) and
    keep the first ``fraction``."""
    scored = [(rule.score(t), conv) for conv, t in groups.items()]
    ranked = sorted(
        scored,
        key=lambda sc: (sc[0] is None, -(sc[0] or 0.0), tie_break(seed, partition, sc[1])),
    )
    kept = ranked[: keep_count(fraction, len(ranked))]
    values = [s for s, _ in kept if s is not None]
    return PartitionChoice(
        conversations=len(groups),
        unscored=sum(s is None for s, _ in scored),
        kept={conv for _, conv in kept},
        kept_scores=(min(values), max(values)) if values else None,
    )


def kept_mask(table: Any, column: str, kept: set[str]) -> Any:
    """The rows of ``table`` whose conversation is kept."""
    import pyarrow as pa

    return pc.is_in(table.column(column), value_set=pa.array(sorted(kept), pa.string()))


def select_rule(shards: dict[str, list[Shard]], name: str) -> Rule:
    """The rule ``name`` for this data (a missing column: the error naming its option)."""
    return rule_named(name, lambda c: has_column(shards, c))
