"""The emulator's speculative counters and its chain verifier: hand-counted cases, the greedy
identity, and the sampling rule's output distribution against the target's."""

from __future__ import annotations

import itertools
import math
import random
from collections import Counter
from collections.abc import Sequence

import pytest

from sglang_emulator.speculation import (
    AcceptanceProfile,
    ServerAcceptance,
    SpecCounters,
    argmax,
    sample,
    simulate_request,
    softmax,
    speculative_generate,
    verify_greedy,
    verify_sampling,
)

ALWAYS = AcceptanceProfile((1.0,))
NEVER = AcceptanceProfile((0.0,))


def test_every_draft_accepted():
    # 10 tokens, 3 drafts per step: prefill 1, then steps of 4 tokens: 5, 9, 13 (3 cut off).
    counters = simulate_request(10, ALWAYS, num_steps=3, seed=0)
    assert counters == SpecCounters(10, 3, 9, (0, 0, 0, 3))
    assert counters.meta_info(num_draft_tokens=4) == {
        "spec_accept_rate": 1.0,
        "spec_accept_length": 10 / 3,
        "spec_num_correct_drafts": 9,
        "spec_num_proposed_drafts": 9,
        "spec_verify_ct": 3,
        "spec_correct_drafts_histogram": [0, 0, 0, 3],
    }


def test_no_draft_accepted():
    counters = simulate_request(10, NEVER, num_steps=3, seed=0)
    assert counters == SpecCounters(10, 9, 0, (9,))
    meta = counters.meta_info(num_draft_tokens=4)
    assert meta["spec_accept_length"] == 10 / 9 and meta["spec_accept_rate"] == 0.0


def test_prefill_tokens_have_no_verify_step():
    assert simulate_request(1, ALWAYS, 3, seed=0) == SpecCounters(1, 0, 0, ())
    assert SpecCounters(1, 0, 0, ()).meta_info(4) == {}  # SGLang adds no field at all
    # One retraction: a second prefill made the second token.
    assert simulate_request(2, NEVER, 3, seed=0, retractions=1) == SpecCounters(2, 0, 0, ())
    assert simulate_request(5, NEVER, 3, seed=0, retractions=1) == SpecCounters(5, 3, 0, (3,))


def test_a_position_profile_by_hand():
    # Position 1 always accepted, position 2 never: every step commits 2 tokens.
    profile = AcceptanceProfile((1.0, 0.0))
    assert simulate_request(8, profile, num_steps=3, seed=5) == SpecCounters(8, 4, 4, (0, 4))


def test_the_draws_are_deterministic_per_seed():
    profile = AcceptanceProfile((0.8, 0.6, 0.4))
    runs = {simulate_request(200, profile, 3, seed=s) for s in (7, 7, 8)}
    assert len(runs) == 2


def test_a_target_mean_accept_length():
    profile = AcceptanceProfile.for_mean_accept_length(1.875, num_steps=3)
    assert profile.position_probs[0] == pytest.approx(0.5)  # 1 + 1/2 + 1/4 + 1/8
    counters = simulate_request(200_001, profile, num_steps=3, seed=1)
    steps_tokens = counters.num_correct_drafts + counters.verify_ct
    assert steps_tokens / counters.verify_ct == pytest.approx(1.875, abs=0.02)
    with pytest.raises(ValueError, match=r"lies in \[1, 4\]"):
        AcceptanceProfile.for_mean_accept_length(4.5, num_steps=3)


def test_server_wide_average_counts_drafts_and_bonus_per_step():
    server = ServerAcceptance()
    assert server.average() is None
    server.record(SpecCounters(10, 3, 9, (0, 0, 0, 3)))
    server.record(SpecCounters(10, 9, 0, (9,)))
    assert server.average() == pytest.approx((9 + 3 + 0 + 9) / 12)
    server.reset()
    assert server.average() is None


# --- The verifier ------------------------------------------------------------------------------


def test_greedy_draft_equal_to_target_is_all_accepted():
    target = [[0.1, 0.7, 0.2], [0.6, 0.3, 0.1], [0.2, 0.2, 0.6]]
    assert verify_greedy(target, [1, 0]).tokens == (1, 0, 2)
    assert verify_greedy(target, [1, 0]).num_correct_drafts == 2


def test_greedy_wrong_draft_gets_the_targets_token():
    target = [[0.1, 0.7, 0.2], [0.6, 0.3, 0.1], [0.2, 0.2, 0.6]]
    assert verify_greedy(target, [2, 0]).tokens == (1,)
    assert verify_greedy(target, [1, 2]).tokens == (1, 0)


def test_argmax_ties_take_the_first_index():
    assert argmax([0.4, 0.4, 0.2]) == 0


def test_sampling_with_the_target_as_draft_accepts_everything():
    p = [[0.2, 0.5, 0.3]] * 4
    for seed in range(50):
        rng = random.Random(seed)
        drafts = [sample(row, rng) for row in p[:3]]
        assert verify_sampling(p, p[:3], drafts, rng).num_correct_drafts == 3


def test_sampling_a_draft_the_target_never_makes_is_rejected():
    p = [[0.0, 0.5, 0.5], [1.0, 0.0, 0.0]]
    q = [[1.0, 0.0, 0.0]]
    for seed in range(50):
        step = verify_sampling(p, q, [0], random.Random(seed))
        assert step.num_correct_drafts == 0 and step.tokens[0] in (1, 2)


def test_sampling_refuses_a_draft_its_own_distribution_cannot_make():
    with pytest.raises(ValueError, match="draft probability 0"):
        verify_sampling([[0.5, 0.5], [0.5, 0.5]], [[1.0, 0.0]], [1], random.Random(0))


def _markov(table: Sequence[Sequence[float]]):
    """A toy model whose next-token logits depend on the last token only."""
    return lambda seq: [math.log(p) if p > 0 else -1e9 for p in table[seq[-1]]]


TARGET = [[0.6, 0.3, 0.1], [0.1, 0.2, 0.7], [0.3, 0.4, 0.3]]
DRAFT = [[0.2, 0.2, 0.6], [0.5, 0.4, 0.1], [0.1, 0.8, 0.1]]  # mostly wrong about the target


def _greedy_decode(model, prompt: list[int], n: int) -> list[int]:
    seq = list(prompt)
    for _ in range(n):
        seq.append(argmax(model(seq)))
    return seq[len(prompt) :]


@pytest.mark.parametrize("draft", [TARGET, DRAFT])
def test_temperature_zero_output_is_plain_greedy(draft):
    target_model = _markov([[0.5, 0.3, 0.2], [0.1, 0.1, 0.8], [0.45, 0.1, 0.45]])
    tokens, counters = speculative_generate(
        target_model, _markov(draft), [0], max_new_tokens=25, num_steps=3, temperature=0.0, seed=0
    )
    assert tokens == _greedy_decode(target_model, [0], 25)
    assert counters.completion_tokens == 25


def test_greedy_counters_by_hand():
    target = _markov(TARGET)
    # Draft == target: 4 tokens per step after the prefill token: 1 + 4*6 = 25 -> 6 steps.
    _, same = speculative_generate(target, target, [0], 25, 3, 0.0, seed=0)
    assert same == SpecCounters(25, 6, 18, (0, 0, 0, 6))
    # A draft whose argmax is never the target's: accept length 1, one token per step.
    never = _markov([[0.0, 1.0, 0.0], [1.0, 0.0, 0.0], [1.0, 0.0, 0.0]])
    _, wrong = speculative_generate(target, never, [0], 25, 3, 0.0, seed=0)
    assert wrong == SpecCounters(25, 24, 0, (24,))


def test_a_stop_token_cuts_the_output_not_the_counters():
    # A greedy walk 0 -> 1 -> 2 -> 0 ..., with token 2 the stop.
    walk = _markov([[0.1, 0.8, 0.1], [0.1, 0.1, 0.8], [0.8, 0.1, 0.1]])
    tokens, counters = speculative_generate(
        walk, walk, [0], 30, num_steps=3, temperature=0.0, seed=0, stop_token_ids=frozenset({2})
    )
    # Prefill makes 1, the first step accepts 3 drafts (2, 0, 1) and a bonus (2): the output
    # stops at its first 2; the counters keep the whole step.
    assert tokens == [1, 2]
    assert counters == SpecCounters(2, 1, 3, (0, 0, 0, 1))


def _sequence_probs(table: Sequence[Sequence[float]], first: int, n: int) -> dict[tuple, float]:
    probs = {}
    for seq in itertools.product(range(len(table)), repeat=n):
        prob, last = 1.0, first
        for token in seq:
            prob *= table[last][token]
            last = token
        probs[seq] = prob
    return probs


def _total_variation(counts: Counter, probs: dict[tuple, float], n: int) -> float:
    return 0.5 * sum(abs(counts[k] / n - p) for k, p in probs.items())


def test_sampling_output_is_distributed_as_the_target():
    """Three tokens at temperature 1, 30000 seeds: the sequences' distribution is the target
    chain's, though the draft's own chain is far from it (so the test can fail)."""
    runs = 30_000
    target, draft = _markov(TARGET), _markov(DRAFT)
    counts: Counter = Counter()
    for seed in range(runs):
        tokens, _ = speculative_generate(target, draft, [0], 3, 2, temperature=1.0, seed=seed)
        counts[tuple(tokens)] += 1
    want = _sequence_probs(TARGET, 0, 3)
    assert _total_variation(counts, want, runs) < 0.02
    assert _total_variation(Counter(_sequence_probs(DRAFT, 0, 3)), want, 1) > 0.3


def test_sampling_with_a_one_hot_draft_is_lossless_too():
    """SGLang's default verify: the draft's argmax, verified as if drawn from a one-hot q."""
    p = [[0.5, 0.3, 0.2], [0.25, 0.25, 0.5]]
    q = [[0.0, 1.0, 0.0]]  # the draft always proposes token 1
    runs = 20_000
    first = Counter(verify_sampling(p, q, [1], random.Random(s)).tokens[0] for s in range(runs))
    assert max(abs(first[t] / runs - p[0][t]) for t in range(3)) < 0.015


def test_softmax_temperature():
    assert softmax([0.0, math.log(3.0)], 1.0) == pytest.approx([0.25, 0.75])
    assert softmax([0.0, math.log(3.0)], 0.5) == pytest.approx([0.1, 0.9])
