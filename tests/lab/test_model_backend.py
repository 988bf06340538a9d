"""The emulator's model backend on a real (tiny, random) transformers Llama: speculation at
temperature 0 gives exactly the target's own greedy ids, and drafts whose accept length is
known by construction get it. Needs torch and transformers (the trainer venv):

    PYTHONPATH=src .venv-trainers-speculators/bin/python -m pytest -c /dev/null --rootdir . \
        -p no:cacheprovider --noconftest tests/lab
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from sglang_emulator.sampling import Sampling  # noqa: E402
from sglang_emulator_transformers import (  # noqa: E402
    ModelGenerator,
    Scorer,
    TransformersTarget,
)
from tests.lab.tiny import tiny_llama_config  # noqa: E402

VOCAB = 97
STEPS = 3


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> TransformersTarget:
    torch.manual_seed(0)
    config = tiny_llama_config(VOCAB, 512)
    model = transformers.LlamaForCausalLM(config)
    with torch.no_grad():
        model.lm_head.weight.mul_(20.0)  # peaked distributions: no near-ties in the argmax
    path: Path = tmp_path_factory.mktemp("target")
    model.save_pretrained(path)
    return TransformersTarget(path)


def greedy_reference(target: TransformersTarget, prompt: list[int], n: int) -> list[int]:
    """Greedy decoding with full forward passes, no cache: the ids to match."""
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(n):
            ids.append(int(target.model(torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[len(prompt) :]


class OracleDraft:
    """Proposes the target's own greedy continuation: every draft is accepted."""

    def __init__(self, target: TransformersTarget) -> None:
        self.target = target

    def propose(self, ids, aux, k, s, rng, slot=0):
        drafts = greedy_reference(self.target, ids, k)
        return drafts, [[1.0 if t == d else 0.0 for t in range(VOCAB)] for d in drafts]


class WrongDraft(OracleDraft):
    """Proposes a token that is never the target's argmax: nothing is accepted."""

    def propose(self, ids, aux, k, s, rng, slot=0):
        right = greedy_reference(self.target, ids, 1)[0]
        drafts = [(right + 1) % VOCAB] * k
        return drafts, [[1.0 if t == d else 0.0 for t in range(VOCAB)] for d in drafts]


GREEDY = Sampling(temperature=0.0, top_k=1, max_new_tokens=40)
PROMPTS = [[5, 17, 42, 8], [60, 3, 3, 91, 12, 7], [1]]


@pytest.mark.parametrize("prompt", PROMPTS)
def test_plain_greedy_is_the_models_own(target: TransformersTarget, prompt: list[int]) -> None:
    out, counters = ModelGenerator(target, None, STEPS).generate(prompt, GREEDY, 0, 40, frozenset())
    assert counters is None
    assert out == greedy_reference(target, prompt, 40)


@pytest.mark.parametrize("prompt", PROMPTS)
def test_oracle_draft_accepts_every_step(target: TransformersTarget, prompt: list[int]) -> None:
    gen = ModelGenerator(target, OracleDraft(target), STEPS)
    out, counters = gen.generate(prompt, GREEDY, 0, 40, frozenset())
    assert out == greedy_reference(target, prompt, 40)
    assert counters is not None
    # 1 token from prefill, then verify steps of STEPS + 1 tokens: ceil(39 / 4) = 10 steps.
    assert counters.verify_ct == 10
    assert counters.num_correct_drafts == 10 * STEPS
    assert counters.correct_drafts_histogram == (0, 0, 0, 10)


@pytest.mark.parametrize("prompt", PROMPTS)
def test_wrong_draft_accepts_nothing(target: TransformersTarget, prompt: list[int]) -> None:
    gen = ModelGenerator(target, WrongDraft(target), STEPS)
    out, counters = gen.generate(prompt, GREEDY, 0, 40, frozenset())
    assert out == greedy_reference(target, prompt, 40)
    assert counters is not None
    assert (counters.verify_ct, counters.num_correct_drafts) == (39, 0)
    assert counters.meta_info(STEPS + 1)["spec_accept_length"] == 40 / 39


def test_stop_token_ends_the_output_and_is_kept(target: TransformersTarget) -> None:
    full = greedy_reference(target, PROMPTS[0], 40)
    stop = full[5]
    first = full.index(stop)
    gen = ModelGenerator(target, OracleDraft(target), STEPS)
    out, counters = gen.generate(PROMPTS[0], GREEDY, 0, 40, frozenset({stop}))
    assert out == full[: first + 1]
    assert counters is not None and counters.completion_tokens == first + 1


def test_sampling_depends_on_the_seed_only(target: TransformersTarget) -> None:
    hot = Sampling(temperature=1.0, top_p=0.9, max_new_tokens=30)
    gen = ModelGenerator(target, None, STEPS)
    a, _ = gen.generate(PROMPTS[1], hot, 7, 30, frozenset())
    b, _ = gen.generate(PROMPTS[1], hot, 7, 30, frozenset())
    c, _ = gen.generate(PROMPTS[1], hot, 8, 30, frozenset())
    assert a == b and a != c


def test_sampled_speculation_counts_every_verify_step(target: TransformersTarget) -> None:
    """Above temperature 0 the speculative sampling rule runs; its counters stay consistent."""
    hot = Sampling(temperature=1.0, max_new_tokens=30)
    gen = ModelGenerator(target, OracleDraft(target), STEPS)
    out, counters = gen.generate(PROMPTS[0], hot, 3, 30, frozenset())
    assert len(out) == 30 and all(0 <= t < VOCAB for t in out)
    assert counters is not None and counters.verify_ct == sum(counters.correct_drafts_histogram)
    accepted = sum(i * n for i, n in enumerate(counters.correct_drafts_histogram))
    assert accepted == counters.num_correct_drafts
    again, _ = gen.generate(PROMPTS[0], hot, 3, 30, frozenset())
    assert again == out  # the request's seed fixes the draws


def reference_logprobs(
    target: TransformersTarget, prompt: list[int], out: list[int], temperature: float
) -> Any:
    """log_softmax(logits / T) at every output position, from one full uncached pass."""
    with torch.no_grad():
        logits = target.model(torch.tensor([prompt + out])).logits[0]
    rows = logits[len(prompt) - 1 : len(prompt) - 1 + len(out)]
    return torch.log_softmax(rows.float() / temperature, dim=-1)


@pytest.mark.parametrize("draft", [None, OracleDraft, WrongDraft])
def test_greedy_logprobs_are_the_targets_log_softmax(
    target: TransformersTarget, draft: type[OracleDraft] | None
) -> None:
    """At temperature 0 SGLang returns log_softmax(logits) (no temperature); with a draft, the
    rows are the target's at the kept positions: the same numbers as without one."""
    gen = ModelGenerator(target, draft(target) if draft else None, STEPS)
    scorer = Scorer(GREEDY, 5)
    out, _ = gen.generate(PROMPTS[1], GREEDY, 0, 40, frozenset(), scorer)
    assert len(scorer.rows) == len(out) == 40
    ref = reference_logprobs(target, PROMPTS[1], out, 1.0)
    for i, (lp, top) in enumerate(scorer.rows):
        assert len(top) == 5 and top[0][1] == out[i] and top[0][0] == lp  # greedy: the top-1
        assert [v for v, _ in top] == sorted((v for v, _ in top), reverse=True)
        assert lp == pytest.approx(float(ref[i, out[i]]), abs=1e-4)
        assert lp == pytest.approx(float(ref[i].max()), abs=1e-4)


def test_sampled_logprobs_are_temperature_scaled(target: TransformersTarget) -> None:
    """Above temperature 0: log(softmax(logits / T)) before top-p, the sampled token's own
    logprob equal to its top-K entry when it is there."""
    warm = Sampling(temperature=0.5, top_p=0.9, max_new_tokens=30)
    scorer = Scorer(warm, 3)
    out, _ = ModelGenerator(target, None, STEPS).generate(
        PROMPTS[0], warm, 5, 30, frozenset(), scorer
    )
    ref = reference_logprobs(target, PROMPTS[0], out, 0.5)
    assert len(scorer.rows) == len(out) == 30
    for i, (lp, top) in enumerate(scorer.rows):
        assert lp == pytest.approx(float(ref[i, out[i]]), abs=1e-4)
        want = torch.topk(ref[i], 3)
        assert [t for _, t in top] == want.indices.tolist()
        assert dict((t, v) for v, t in top).get(out[i], lp) == lp
    assert torch.logsumexp(ref[0], 0) == pytest.approx(0.0, abs=1e-5)  # a distribution


def test_an_underflowed_probability_is_clamped_as_sglang_sends_it() -> None:
    """Sampling takes log(softmax(logits / T)): a probability that underflowed is -inf there,
    and SGLang clamps it to float32's lowest value (layers/logprob_processor.py:926); greedy
    takes log_softmax, finite everywhere (both recorded from SGLang's own code in
    tests/fixtures/sglang-0.5.23/generate_logprobs_*.json)."""
    logits = torch.tensor([[10.0, 9.0, -200.0, -300.0]])
    sampled = Scorer(Sampling(temperature=1.0, max_new_tokens=1), 4)
    sampled.add(logits, [0])
    lowest = torch.finfo(torch.float32).min
    assert [v for v, _ in sampled.rows[0][1]][2:] == [lowest, lowest]
    greedy = Scorer(GREEDY, 4)
    greedy.add(logits, [0])
    assert all(lowest < v for v, _ in greedy.rows[0][1])


def test_a_padded_batch_gives_each_prompt_its_own_greedy_ids(target: TransformersTarget) -> None:
    """Prompts of different lengths served together (left padding, one cache, rows leaving
    it at their own limit or stop) give each prompt the ids it gets alone."""
    limits = [40, 7, 25]
    stop = greedy_reference(target, PROMPTS[1], 12)[11]
    stops = [frozenset(), frozenset(), frozenset({stop})]
    results = ModelGenerator(target, None, STEPS).generate_many(
        PROMPTS, [GREEDY] * 3, [0, 0, 0], limits, stops, [None, None, None]
    )
    outs = [ids for ids, _ in results]
    for prompt, limit, out, st in zip(PROMPTS, limits, outs, stops, strict=True):
        want = greedy_reference(target, prompt, limit)
        cut = next((i + 1 for i, t in enumerate(want) if t in st), len(want))
        assert out == want[:cut]
    assert len(outs[0]) == 40 and len(outs[1]) == 7


def test_a_batch_scores_each_row_as_alone(target: TransformersTarget) -> None:
    """The logprob rows of a batched prompt equal those it gets served alone."""
    alone = Scorer(GREEDY, 3)
    ModelGenerator(target, None, STEPS).generate(PROMPTS[0], GREEDY, 0, 10, frozenset(), alone)
    scorers = [Scorer(GREEDY, 3), Scorer(GREEDY, 3)]
    ModelGenerator(target, None, STEPS).generate_many(
        PROMPTS[:2], [GREEDY] * 2, [0, 0], [10, 10], [frozenset()] * 2, list(scorers)
    )
    for (lp, top), (lp2, top2) in zip(alone.rows, scorers[0].rows, strict=True):
        assert lp == pytest.approx(lp2, abs=1e-4)
        assert [t for _, t in top] == [t for _, t in top2]


class AlternatingDraft(OracleDraft):
    """Right on even verify steps of a row, wrong on odd ones: rows of one batch accept
    different numbers of drafts at each step."""

    def __init__(self, target: TransformersTarget) -> None:
        super().__init__(target)
        self.calls: dict[int, int] = {}

    def propose(self, ids, aux, k, s, rng, slot=0):
        n = self.calls[slot] = self.calls.get(slot, 0) + 1
        drafts = greedy_reference(self.target, ids, k)
        if n % 2 == 0:
            drafts[k // 2] = (drafts[k // 2] + 1) % VOCAB
        return drafts, [[1.0 if t == d else 0.0 for t in range(VOCAB)] for d in drafts]


@pytest.mark.parametrize("draft", [OracleDraft, WrongDraft, AlternatingDraft])
def test_a_speculating_batch_gives_each_row_its_ids_and_counters_alone(
    target: TransformersTarget, draft: type[OracleDraft]
) -> None:
    """Rows that accept different numbers of drafts share one forward pass per verify step
    (the rejected drafts masked out of the cache): each row's ids are its greedy ids, and its
    counters and logprob rows are those it gets served alone."""
    limits = [40, 7, 25]
    stop = greedy_reference(target, PROMPTS[1], 12)[11]
    stops = [frozenset(), frozenset(), frozenset({stop})]
    batch_scorers = [Scorer(GREEDY, 3) for _ in PROMPTS]
    batch = ModelGenerator(target, draft(target), STEPS).generate_many(
        PROMPTS, [GREEDY] * 3, [0, 0, 0], limits, stops, list(batch_scorers)
    )
    for i, (prompt, limit, st) in enumerate(zip(PROMPTS, limits, stops, strict=True)):
        alone_scorer = Scorer(GREEDY, 3)
        ids, counters = ModelGenerator(target, draft(target), STEPS).generate(
            prompt, GREEDY, 0, limit, st, alone_scorer
        )
        want = greedy_reference(target, prompt, limit)
        cut = next((j + 1 for j, t in enumerate(want) if t in st), len(want))
        assert batch[i][0] == ids == want[:cut]
        assert batch[i][1] == counters
        assert counters is not None and counters.verify_ct > 0
        got_rows = batch_scorers[i].rows
        assert len(got_rows) == len(alone_scorer.rows) == len(ids)
        for (lp, top), (lp2, top2) in zip(got_rows, alone_scorer.rows, strict=True):
            assert lp == pytest.approx(lp2, abs=1e-4)
            assert [t for _, t in top] == [t for _, t in top2]


def test_sampled_speculation_in_a_batch_draws_as_alone(target: TransformersTarget) -> None:
    """Above temperature 0 each row draws from its own seed's generator in its own order:
    the same output and counters in a batch as alone."""
    hot = Sampling(temperature=1.0, max_new_tokens=30)
    gen = ModelGenerator(target, AlternatingDraft(target), STEPS)
    batch = gen.generate_many(
        PROMPTS, [hot] * 3, [3, 4, 5], [30] * 3, [frozenset()] * 3, [None] * 3
    )
    for prompt, seed, got in zip(PROMPTS, [3, 4, 5], batch, strict=True):
        alone = ModelGenerator(target, AlternatingDraft(target), STEPS)
        assert got == alone.generate(prompt, hot, seed, 30, frozenset())
