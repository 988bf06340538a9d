"""Bootstrap intervals and seed spread: what a user reads off a table of accept lengths."""

from __future__ import annotations

import random

import pytest

from eagle3_datagen.report.intervals import (
    NO_DIFFERENCE,
    paired_difference,
    ratio,
    ratio_interval,
    seed_spread,
)


def _groups(rng: random.Random, n: int, rate: float) -> list[tuple[float, float]]:
    """Conversations with 5-40 verify steps each, committing about ``rate`` tokens per step."""
    out: list[tuple[float, float]] = []
    for _ in range(n):
        steps = rng.randint(5, 40)
        out.append((sum(rng.choice((1, 2, 3, 4)) * rate / 2.5 for _ in range(steps)), float(steps)))
    return out


def test_ratio_is_a_ratio_of_sums_not_a_mean_of_ratios() -> None:
    assert ratio([(10, 10), (1, 100)]) == pytest.approx(11 / 110)


def test_interval_holds_the_estimate_and_narrows_with_more_groups() -> None:
    rng = random.Random(1)
    small = ratio_interval(_groups(rng, 20, 2.5))
    large = ratio_interval(_groups(rng, 400, 2.5))
    for iv in (small, large):
        assert iv.low <= iv.estimate <= iv.high
    assert (large.high - large.low) < (small.high - small.low) / 2


def test_interval_covers_the_true_rate_about_95_percent_of_the_time() -> None:
    rng = random.Random(7)
    covered = 0
    for i in range(100):
        iv = ratio_interval(_groups(rng, 40, 2.5), resamples=400, seed=i)
        covered += iv.low <= 2.5 <= iv.high
    assert 85 <= covered <= 100


def test_the_same_inputs_give_the_same_interval() -> None:
    g = _groups(random.Random(3), 30, 2.0)
    assert ratio_interval(g, seed=5) == ratio_interval(g, seed=5)


def test_paired_difference_finds_a_real_gap_and_says_no_difference_for_none() -> None:
    rng = random.Random(11)
    base = _groups(rng, 60, 2.0)
    better = [(num * 1.3, den) for num, den in base]
    gap = paired_difference(better, base)
    assert gap.low > 0 and gap.verdict() == "higher"
    same = [(num * rng.uniform(0.97, 1.03), den) for num, den in base]
    assert paired_difference(same, base).verdict() == NO_DIFFERENCE


def test_pairing_is_narrower_than_two_independent_intervals() -> None:
    """The prompts' own spread cancels in a paired difference."""
    rng = random.Random(2)
    base = _groups(rng, 50, 2.0)
    other = [(num * 1.05, den) for num, den in base]
    paired = paired_difference(other, base)
    a, b = ratio_interval(other), ratio_interval(base)
    assert (paired.high - paired.low) < (a.high - a.low) + (b.high - b.low)


def test_unpaired_inputs_are_refused() -> None:
    with pytest.raises(ValueError, match="pair them"):
        paired_difference([(1, 1)], [(1, 1), (2, 2)])
    with pytest.raises(ValueError, match="no groups"):
        ratio_interval([])


def test_seed_spread() -> None:
    s = seed_spread([2.0, 2.2, 2.4])
    assert s.mean == pytest.approx(2.2) and s.sd == pytest.approx(0.2) and s.seeds == 3
    assert s.text() == "2.200 ± 0.200"
    assert seed_spread([1.5]).sd == 0.0
