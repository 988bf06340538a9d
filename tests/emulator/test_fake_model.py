"""The fake model in-process: determinism, prefix property, prompt shapes, speed."""

from __future__ import annotations

import hashlib
import time

import pytest

from sglang_emulator.fake_model import FakeModel, _tools_from_json
from sglang_emulator.vocab import Vocab, pack_int32
from tests.support import TOKENIZER_DIR


@pytest.fixture(scope="module")
def vocab() -> Vocab:
    return Vocab(TOKENIZER_DIR)


@pytest.fixture(scope="module")
def model(vocab: Vocab) -> FakeModel:
    return FakeModel(vocab)


def _digest(ids: list[int]) -> bytes:
    return hashlib.sha256(pack_int32(ids)).digest()


def test_vocab_resolves_tokens_by_string(vocab: Vocab) -> None:
    tok = vocab.tokenizer
    assert vocab.special["think"] == tok.token_to_id("<think>")
    assert vocab.special["im_end"] == tok.token_to_id("<|im_end|>")
    # config.json eos ∪ generation_config.json eos ∪ tokenizer_config eos_token
    assert vocab.eos_ids == {tok.token_to_id("[EOS]"), tok.token_to_id("<|im_end|>")}
    assert not set(vocab.word_pool) & vocab.added_ids
    assert vocab.meta.model_type == "kimi_k25" and vocab.meta.context_length == 262144


def test_shorter_limit_is_a_prefix(model: FakeModel, vocab: Vocab) -> None:
    think = vocab.special["think"]
    for seed in range(20):
        ids = [5, 6, 7, seed, think]
        full = model.generate(ids, _digest(ids), seed, 3000)
        for limit in (1, 2, 17, 150, 2999):
            assert model.generate(ids, _digest(ids), seed, limit) == full[:limit]


def test_prompt_shapes(model: FakeModel, vocab: Vocab) -> None:
    sp = vocab.special
    assert model.shape([1, sp["think"]]).thinking == "open"
    assert model.shape([1, sp["think"], sp["think_end"]]).thinking == "closed"
    assert model.shape([1, sp["im_middle"]]).thinking == "absent"
    assert model.shape([1, sp["im_middle"]]).tools == ()


def test_tool_declarations_in_other_formats() -> None:
    assert [t.name for t in _tools_from_json('[{"name": "a"}, {"name": "b"}]')] == ["a", "b"]
    ts = "namespace functions { type lookup = (_: {q: string}) => any; }"
    assert [t.name for t in _tools_from_json(ts)] == ["lookup"]
    assert [t.name for t in _tools_from_json("garbage")] == ["tool"]


def test_lengths_are_long_tailed_with_the_requested_mean(vocab: Vocab) -> None:
    model = FakeModel(vocab, mean_output_tokens=200, max_output_tokens=100000)
    end = vocab.special["im_end"]
    lengths = []
    for seed in range(400):
        ids = [9, seed % 50, vocab.special["think"]]
        out = model.generate(ids, _digest(ids), seed, 100000)
        lengths.append(out.index(end))
    mean = sum(lengths) / len(lengths)
    assert 140 < mean < 280
    assert max(lengths) > 3 * mean  # a long tail


def test_generation_and_decode_are_fast(model: FakeModel, vocab: Vocab) -> None:
    ids = [5, 6, 7] * 300 + [vocab.special["think"]]
    digest = _digest(ids)
    n = 300
    t0 = time.perf_counter()
    for seed in range(n):
        vocab.decode(model.generate(ids, digest, seed, 200))
    per_call = (time.perf_counter() - t0) / n
    assert per_call < 2e-3  # typically ~0.1 ms; generous for slow CI machines
