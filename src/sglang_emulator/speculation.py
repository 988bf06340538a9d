"""Speculative decoding for the emulator: SGLang 0.5.23's per-request counters, and a lossless
chain verifier (topk 1) to make them from real distributions.

Why: with ``--speculative-algorithm`` SGLang reports acceptance per request in ``meta_info``,
and the pipeline measures a draft model by it. The emulator has no draft model, so it either
draws each verify step's accepted length from an :class:`AcceptanceProfile` (deterministic per
request seed, :func:`simulate_request`), or runs :func:`speculative_generate` over toy
distributions. Either way the counters accumulate as SGLang's scheduler does
(docs/sglang-speculative.md):

- the first output token comes from prefill (one more per re-prefill after a retraction), not
  from a verify step;
- every verify step adds 1 to ``spec_verify_ct``, its accepted drafts (the bonus token
  excluded) to ``spec_num_correct_drafts`` and to ``spec_correct_drafts_histogram``, all of the
  step even when a stop or ``max_new_tokens`` cuts its tokens from the output;
- ``meta_info`` gets the fields only when the request had a verify step.

Pure Python, seeded :class:`random.Random`: no torch, no numpy.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

# SGLang treats a temperature below this as greedy (sampling_params.py).
GREEDY_BELOW = 1e-6
# /server_info internal_states key of the server-wide figure (SGLang 0.5.23).
AVG_ACCEPT_LENGTH_KEY = "avg_spec_accept_length"


@dataclass(frozen=True, slots=True)
class SpecCounters:
    """One request's counters, as SGLang's ``Req`` holds them when the request finishes."""

    completion_tokens: int
    verify_ct: int
    num_correct_drafts: int
    correct_drafts_histogram: tuple[int, ...]

    def meta_info(self, num_draft_tokens: int) -> dict[str, Any]:
        """The spec fields SGLang adds to the finished request's ``meta_info``, by its formulas
        and in its order (tokenizer_manager.py, ``_calculate_spec_decoding_metrics``)."""
        fields: dict[str, Any] = {}
        if self.verify_ct <= 0:
            return fields
        proposed = self.verify_ct * (num_draft_tokens - 1)
        if proposed > 0:
            fields["spec_accept_rate"] = self.num_correct_drafts / proposed
            fields["spec_accept_length"] = self.completion_tokens / self.verify_ct
            fields["spec_num_correct_drafts"] = self.num_correct_drafts
            fields["spec_num_proposed_drafts"] = proposed
            fields["spec_verify_ct"] = self.verify_ct
        if self.correct_drafts_histogram:
            fields["spec_correct_drafts_histogram"] = list(self.correct_drafts_histogram)
        return fields


class VerifyTally:
    """The scheduler's per-request accumulation (schedule_batch.py, ``Req``); the fake
    model and the transformers backend (model_backend.py) both count with it."""

    def __init__(self) -> None:
        self.verify_ct = 0
        self.correct = 0
        self.histogram: list[int] = []

    def step(self, correct: int) -> None:
        self.verify_ct += 1
        self.correct += correct
        if len(self.histogram) <= correct:  # grows only as far as the longest run seen
            self.histogram.extend([0] * (correct + 1 - len(self.histogram)))
        self.histogram[correct] += 1

    def counters(self, completion_tokens: int) -> SpecCounters:
        return SpecCounters(completion_tokens, self.verify_ct, self.correct, tuple(self.histogram))


@dataclass(frozen=True, slots=True)
class AcceptanceProfile:
    """How likely each draft position is accepted: ``position_probs[j]`` is the probability
    that position ``j + 1`` is accepted once position ``j`` was (a chain stops at its first
    rejection). Positions past the tuple reuse its last value."""

    position_probs: tuple[float, ...]

    def __post_init__(self) -> None:
        if not self.position_probs or not all(0.0 <= p <= 1.0 for p in self.position_probs):
            raise ValueError(f"position probabilities must lie in [0, 1]: {self.position_probs}")

    @classmethod
    def for_mean_accept_length(cls, mean: float, num_steps: int) -> AcceptanceProfile:
        """The constant per-position probability ``a`` whose expected accept length
        ``1 + a + a**2 + ... + a**num_steps`` is ``mean`` (bisection; 1 <= mean <= steps + 1)."""
        if not 1.0 <= mean <= num_steps + 1:
            raise ValueError(
                f"a mean accept length of {num_steps} steps lies in [1, {num_steps + 1}]"
            )
        low, high = 0.0, 1.0
        for _ in range(60):
            mid = (low + high) / 2
            if cls((mid,)).mean_accept_length(num_steps) < mean:
                low = mid
            else:
                high = mid
        return cls(((low + high) / 2,))

    def prob(self, position: int) -> float:
        """The conditional acceptance probability of draft position ``position`` (1-based)."""
        return self.position_probs[min(position, len(self.position_probs)) - 1]

    def mean_accept_length(self, num_steps: int) -> float:
        """Expected tokens per verify step: 1 (bonus) + P(position j accepted), j = 1..steps."""
        total, reach = 1.0, 1.0
        for j in range(1, num_steps + 1):
            reach *= self.prob(j)
            total += reach
        return total

    def draw(self, rng: random.Random, num_steps: int) -> int:
        """The accepted drafts of one verify step."""
        correct = 0
        while correct < num_steps and rng.random() < self.prob(correct + 1):
            correct += 1
        return correct


def simulate_request(
    num_output_tokens: int,
    profile: AcceptanceProfile,
    num_steps: int,
    seed: int,
    retractions: int = 0,
) -> SpecCounters:
    """The counters of a request that produced ``num_output_tokens`` tokens, its verify steps'
    accepted lengths drawn from ``profile`` with ``random.Random(seed)``.

    ``1 + retractions`` tokens came from prefills; verify steps make the rest, the last one
    possibly more than the output kept.
    """
    rng = random.Random(seed)
    tally = VerifyTally()
    made = min(num_output_tokens, 1 + retractions)
    while made < num_output_tokens:
        correct = profile.draw(rng, num_steps)
        tally.step(correct)
        made += correct + 1
    return tally.counters(num_output_tokens)


class ServerAcceptance:
    """The server-wide ``avg_spec_accept_length`` of ``/server_info``'s ``internal_states``:
    tokens committed per verify step (accepted drafts + bonus) over the server's life.

    SGLang folds steps in at each decode log interval (every 40 decode batches by default) and
    ``/flush_cache`` resets it; the emulator counts finished requests at once.
    """

    def __init__(self) -> None:
        self.accept_tokens = 0
        self.verify_steps = 0

    def record(self, counters: SpecCounters) -> None:
        self.accept_tokens += counters.num_correct_drafts + counters.verify_ct
        self.verify_steps += counters.verify_ct

    def average(self) -> float | None:
        """``None`` before the first verify step: SGLang then leaves the key out."""
        return self.accept_tokens / self.verify_steps if self.verify_steps else None

    def reset(self) -> None:
        self.accept_tokens = self.verify_steps = 0


# --- The verifier ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Verified:
    """One verify step: the accepted drafts, then the target's correction or bonus token."""

    tokens: tuple[int, ...]
    num_correct_drafts: int


def softmax(logits: Sequence[float], temperature: float) -> list[float]:
    """Probabilities of ``logits`` at ``temperature`` (> 0)."""
    top = max(logits)
    weights = [math.exp((x - top) / temperature) for x in logits]
    total = sum(weights)
    return [w / total for w in weights]


def argmax(values: Sequence[float]) -> int:
    """The first index of the largest value (torch.argmax's tie rule): ``max`` keeps the first
    of equal values and ``index`` finds the first, both in C (a 160k vocabulary row: ms)."""
    return values.index(max(values))


def sample(probs: Sequence[float], rng: random.Random) -> int:
    """One token from ``probs`` (which need not be normalized) by inverse CDF."""
    u = rng.random() * sum(probs)
    cumulative = 0.0
    last = 0
    for token, p in enumerate(probs):
        if p > 0:
            cumulative += p
            last = token
            if u < cumulative:
                return token
    return last  # rounding left u at the very top


def verify_greedy(target_probs: Sequence[Sequence[float]], draft_tokens: Sequence[int]) -> Verified:
    """Temperature 0: accept while a draft token is the target's argmax; then the target's own
    argmax (the correction, or the bonus after all ``K`` drafts). ``target_probs`` has K + 1
    rows: the target's distribution before each draft and after the last (logits do as well:
    only the argmax counts)."""
    _check_rows(target_probs, draft_tokens)
    for j, token in enumerate(draft_tokens):
        best = argmax(target_probs[j])
        if token != best:
            return Verified((*draft_tokens[:j], best), j)
    return Verified((*draft_tokens, argmax(target_probs[-1])), len(draft_tokens))


def verify_sampling(
    target_probs: Sequence[Sequence[float]],
    draft_probs: Sequence[Sequence[float]],
    draft_tokens: Sequence[int],
    rng: random.Random,
) -> Verified:
    """Speculative sampling: accept draft ``x`` with probability ``min(1, p(x) / q(x))``; at the
    first rejection emit a token from ``norm(max(0, p - q))``; after all ``K`` accepted, a bonus
    token from ``p_{K+1}``. The emitted tokens are distributed exactly as the target's.

    ``draft_probs`` are the distributions the drafts were drawn from; SGLang's default verify
    (no ``--speculative-use-rejection-sampling``) is this rule with ``q`` one-hot on the draft.
    """
    _check_rows(target_probs, draft_tokens)
    for j, token in enumerate(draft_tokens):
        p, q = target_probs[j][token], draft_probs[j][token]
        if q <= 0:
            raise ValueError(f"draft token {token} at position {j + 1} has draft probability 0")
        if rng.random() < min(1.0, p / q):
            continue
        residual = [
            max(0.0, pt - qt) for pt, qt in zip(target_probs[j], draft_probs[j], strict=True)
        ]
        fix = sample(residual if sum(residual) > 0 else target_probs[j], rng)
        return Verified((*draft_tokens[:j], fix), j)
    return Verified((*draft_tokens, sample(target_probs[-1], rng)), len(draft_tokens))


def _check_rows(target_probs: Sequence[Sequence[float]], draft_tokens: Sequence[int]) -> None:
    if len(target_probs) != len(draft_tokens) + 1:
        raise ValueError(
            f"{len(draft_tokens)} draft tokens need {len(draft_tokens) + 1} target distributions, "
            f"got {len(target_probs)}"
        )


Model = Callable[[Sequence[int]], Sequence[float]]  # token ids so far -> next-token logits


def _next(
    logits: Sequence[float], temperature: float, rng: random.Random
) -> tuple[int, list[float]]:
    """A token and the distribution it came from (one-hot on the argmax when greedy)."""
    if temperature < GREEDY_BELOW:
        token = argmax(logits)
        return token, [1.0 if i == token else 0.0 for i in range(len(logits))]
    probs = softmax(logits, temperature)
    return sample(probs, rng), probs


def _draft_and_verify(
    target: Model,
    draft: Model,
    seq: list[int],
    num_steps: int,
    temperature: float,
    rng: random.Random,
) -> Verified:
    drafts: list[int] = []
    draft_probs: list[list[float]] = []
    for _ in range(num_steps):
        token, probs = _next(draft([*seq, *drafts]), temperature, rng)
        drafts.append(token)
        draft_probs.append(probs)
    logits = [target([*seq, *drafts[:j]]) for j in range(num_steps + 1)]
    if temperature < GREEDY_BELOW:
        return verify_greedy(logits, drafts)
    target_probs = [softmax(row, temperature) for row in logits]
    return verify_sampling(target_probs, draft_probs, drafts, rng)


def speculative_generate(
    target: Model,
    draft: Model,
    prompt: Sequence[int],
    max_new_tokens: int,
    num_steps: int,
    temperature: float,
    seed: int,
    stop_token_ids: frozenset[int] = frozenset(),
) -> tuple[list[int], SpecCounters]:
    """Generate with a draft chain of ``num_steps`` tokens per verify step (topk 1), as SGLang
    does: the first token from prefill, then verify steps; the output stops at the first stop
    token (kept) or at ``max_new_tokens``, while the counters keep every verified token."""
    rng = random.Random(seed)
    first, _ = _next(target(list(prompt)), temperature, rng)
    output = [first]
    tally = VerifyTally()
    while not _finished(output, max_new_tokens, stop_token_ids):
        step = _draft_and_verify(target, draft, [*prompt, *output], num_steps, temperature, rng)
        tally.step(step.num_correct_drafts)
        output.extend(step.tokens)
    output = _through_stop(output, max_new_tokens, stop_token_ids)
    return output, tally.counters(len(output))


def _finished(output: Sequence[int], max_new_tokens: int, stop: frozenset[int]) -> bool:
    return len(output) >= max_new_tokens or any(t in stop for t in output)


def _through_stop(output: list[int], max_new_tokens: int, stop: frozenset[int]) -> list[int]:
    """SGLang's ``output_ids_through_stop``: up to and with the first stop token, at most
    ``max_new_tokens`` (a stop past the cap finishes by length)."""
    for i, token in enumerate(output):
        if token in stop:
            return output[: min(i + 1, max_new_tokens)]
    return output[:max_new_tokens]
