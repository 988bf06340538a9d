"""The selection rules of ``eagle3-datagen select`` (docs/select.md): what each scores a
conversation by, from which stored columns, and which option produces them.

A rule scores a *group*, every record of one conversation (partition + ``conversation_id``: all
turns and samples of one input line), from sums over its records, so a long record weighs as
many tokens as it has. Higher scores are kept first (``acceptance`` negates its accept length).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from eagle3_datagen.errors import DatasetError

LOGPROBS_OPTION = "`logprobs: {top_k: K}` on the partition in the run's config (docs/logprobs.md)"
SPEC_OPTION = "`server.speculative` in the run's config (docs/sglang-speculative.md)"


@dataclass(slots=True)
class Tally:
    """One group's sums over its records: what every rule's score is made of."""

    records: int = 0
    tokens: int = 0
    entropy_tokens: float = 0.0  # sum of entropy_mean x output tokens
    entropy_weight: int = 0  # output tokens of records with an entropy
    surprise: float = 0.0  # sum over output tokens of 1 - p(sampled)
    surprise_tokens: int = 0
    correct: int = 0  # spec_num_correct_drafts
    proposed: int = 0  # spec_num_proposed_drafts
    spec_tokens: int = 0  # output tokens of records with a verify count
    verify: int = 0  # spec_verify_ct

    def add(self, row: dict[str, Any]) -> None:
        n = len(row["output_ids"]) if "output_ids" in row else row["completion_tokens"]
        self.records += 1
        self.tokens += n
        if row.get("entropy_mean") is not None:
            self.entropy_tokens += row["entropy_mean"] * n
            self.entropy_weight += n
        lps = row.get("output_logprobs")
        if lps is not None:
            self.surprise += math.fsum(1.0 - math.exp(lp) for lp in lps)
            self.surprise_tokens += len(lps)
        if row.get("spec_verify_ct") is not None:
            self.verify += row["spec_verify_ct"]
            self.spec_tokens += n
            self.correct += row.get("spec_num_correct_drafts") or 0
            self.proposed += row.get("spec_num_proposed_drafts") or 0


@dataclass(frozen=True, slots=True)
class Rule:
    """One rule: its columns (read from the shards), how it scores a tally (None: the group
    has none of its columns), and the error when no record has them."""

    name: str
    summary: str
    columns: tuple[str, ...]
    score: Callable[[Tally], float | None]
    needs: str = ""  # the option that produces the columns, for the error
    params: dict[str, Any] = field(default_factory=dict)


def _flatness(t: Tally) -> float | None:
    # Token-weighted mean of the per-record mean entropy: the group's mean per-token entropy.
    return t.entropy_tokens / t.entropy_weight if t.entropy_weight else None


def _deviation_from_acceptance(t: Tally) -> float | None:
    return 1.0 - t.correct / t.proposed if t.proposed else None


def _deviation_from_logprobs(t: Tally) -> float | None:
    return t.surprise / t.surprise_tokens if t.surprise_tokens else None


def _acceptance(t: Tally) -> float | None:
    # Lowest accept length first: tokens per verify step over the group, negated.
    return -(t.spec_tokens / t.verify) if t.verify else None


def _random(t: Tally) -> float | None:
    return 0.0  # every group ties; the seeded tie-break orders them


RULES: dict[str, Rule] = {
    r.name: r
    for r in (
        Rule(
            "flatness",
            "highest mean per-token entropy of the target's distribution (top-K estimate)",
            ("entropy_mean",),
            _flatness,
            LOGPROBS_OPTION + " with K > 0",
        ),
        Rule(
            "acceptance",
            "lowest accept length of the incumbent draft (output tokens per verify step)",
            ("spec_verify_ct",),
            _acceptance,
            SPEC_OPTION,
        ),
        Rule("random", "a seeded random draw (the control)", (), _random),
    )
}
DEVIATION_SOURCES = ("acceptance", "logprobs")


def deviation_rule(source: str) -> Rule:
    """``deviation`` from the stored acceptance (the share of the incumbent draft's proposed
    tokens the target rejected: 1 - correct / proposed) or, without a draft, from the stored
    logprobs (the mean over tokens of 1 - p(sampled): how often the target itself would
    have drawn another token)."""
    if source == "acceptance":
        return Rule(
            "deviation",
            "highest share of draft tokens the target rejected (1 - correct / proposed)",
            ("spec_num_correct_drafts", "spec_num_proposed_drafts", "spec_verify_ct"),
            _deviation_from_acceptance,
            SPEC_OPTION,
            {"source": "acceptance"},
        )
    return Rule(
        "deviation",
        "highest mean over output tokens of 1 - p(sampled token) under the target",
        ("output_logprobs",),
        _deviation_from_logprobs,
        LOGPROBS_OPTION,
        {"source": "logprobs"},
    )


def rule_named(name: str, has_column: Callable[[str], bool]) -> Rule:
    """The rule ``name``; ``deviation`` takes the acceptance when the data has it, else the
    logprobs. ``has_column(c)``: some record holds a value of column ``c``. A rule whose
    columns no record holds raises DatasetError naming the option that produces them."""
    if name == "deviation":
        rule = deviation_rule(
            "acceptance" if has_column("spec_num_proposed_drafts") else "logprobs"
        )
        if not has_column(rule.columns[0]):
            raise DatasetError(
                "rule 'deviation' needs the acceptance columns (spec_num_correct_drafts, "
                "spec_num_proposed_drafts) or output_logprobs, and no record has them: set "
                f"{SPEC_OPTION}, or {LOGPROBS_OPTION}, and run again"
            )
        return rule
    if name not in RULES:
        raise DatasetError(f"unknown rule {name!r}: one of {[*RULES, 'deviation']}")
    rule = RULES[name]
    missing = [c for c in rule.columns if not has_column(c)]
    if missing:
        raise DatasetError(
            f"rule {name!r} needs column {missing[0]}, and no record of the dataset has it: "
            f"set {rule.needs} and run again"
        )
    return rule


def tie_break(seed: int, partition: str, conversation: str) -> float:
    """A seeded hash in [0, 1): the order of groups of equal score (and all of ``random``)."""
    digest = hashlib.sha256(f"select\0{seed}\0{partition}\0{conversation}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64
