"""The selection rules' scores from a conversation's records, the kept count, the order of
ties, and the errors that name the option a missing column needs."""

from __future__ import annotations

import math

import pytest

from eagle3_datagen.errors import DatasetError
from eagle3_datagen.select.choose import choose, keep_count
from eagle3_datagen.select.rules import Tally, deviation_rule, rule_named


def _tally(*rows: dict[str, object]) -> Tally:
    t = Tally()
    for row in rows:
        t.add({"completion_tokens": 0, **row})
    return t


def test_flatness_is_the_token_weighted_mean_entropy() -> None:
    rule = rule_named("flatness", lambda c: True)
    t = _tally(
        {"output_ids": [1] * 3, "entropy_mean": 1.0},
        {"output_ids": [1] * 1, "entropy_mean": 2.0},
    )
    assert rule.score(t) == pytest.approx((3 * 1.0 + 1 * 2.0) / 4)
    assert rule.score(_tally({"output_ids": [1]})) is None  # no entropy: unscored


def test_deviation_from_logprobs_is_the_mean_chance_of_another_token() -> None:
    rule = deviation_rule("logprobs")
    t = _tally({"output_ids": [1, 2], "output_logprobs": [0.0, math.log(0.25)]})
    assert rule.score(t) == pytest.approx((0.0 + 0.75) / 2)


def test_deviation_and_acceptance_from_the_acceptance_columns() -> None:
    row = {
        "output_ids": [1] * 9,
        "spec_verify_ct": 4,
        "spec_num_correct_drafts": 3,
        "spec_num_proposed_drafts": 12,
    }
    t = _tally(row, {**row, "spec_num_correct_drafts": 9})
    assert deviation_rule("acceptance").score(t) == pytest.approx(1 - 12 / 24)
    assert rule_named("acceptance", lambda c: True).score(t) == pytest.approx(-18 / 8)
    # deviation takes the acceptance when the data has it, else the logprobs
    assert rule_named("deviation", lambda c: True).params == {"source": "acceptance"}
    only_logprobs = rule_named("deviation", lambda c: c == "output_logprobs")
    assert only_logprobs.params == {"source": "logprobs"}


@pytest.mark.parametrize(
    ("rule", "option"),
    [
        ("flatness", "`logprobs: {top_k: K}` on the partition"),
        ("acceptance", "`server.speculative`"),
        ("deviation", "`server.speculative`"),
    ],
)
def test_a_missing_column_names_its_option(rule: str, option: str) -> None:
    with pytest.raises(DatasetError, match="no record") as err:
        rule_named(rule, lambda c: False)
    assert option in str(err.value)


def test_keep_count_rounds_half_up_and_keeps_one() -> None:
    assert [keep_count(f, 10) for f in (0.01, 0.25, 0.5, 1.0)] == [1, 3, 5, 10]
    assert keep_count(0.5, 0) == 0


def test_ties_and_unscored_conversations_rank_last_in_a_seeded_order() -> None:
    rule = rule_named("flatness", lambda c: True)
    groups = {f"c{i}": _tally({"output_ids": [1], "entropy_mean": 1.0}) for i in range(8)}
    groups["none"] = _tally({"output_ids": [1]})
    groups["top"] = _tally({"output_ids": [1], "entropy_mean": 5.0})
    one = choose("p", groups, rule, 0.3, seed=1)
    assert "top" in one.kept and "none" not in one.kept and len(one.kept) == 3
    assert one.unscored == 1
    assert choose("p", groups, rule, 0.3, seed=1).kept == one.kept  # deterministic
    others = {frozenset(choose("p", groups, rule, 0.3, seed=s).kept) for s in range(2, 8)}
    assert len(others) > 1  # the seed decides among ties
