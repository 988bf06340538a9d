"""The emulator serving a model whose tokenizer is remote code over tiktoken (Kimi-K2.5's kind).

No ``tokenizer.json``, special tokens at 163584 and up: the emulator must load it through
transformers (only with ``--trust-remote-code``, like SGLang) and emit ids of that vocabulary.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pytest

from sglang_emulator.fake_model import FakeModel
from sglang_emulator.vocab import Vocab, pack_int32
from tests.support import REPO
from tests.support.emulator import EmulatorFactory
from tests.support.prompts import WEATHER_TOOL, render

TIKTOKEN_DIR = REPO / "src" / "eagle3_datagen" / "assets" / "kimi-k2.5-tiktoken"


@pytest.fixture(scope="module")
def hf() -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(TIKTOKEN_DIR), trust_remote_code=True)


@pytest.fixture(scope="module")
def vocab() -> Vocab:
    return Vocab(TIKTOKEN_DIR, trust_remote_code=True)


def test_remote_code_tokenizer_needs_trust_remote_code() -> None:
    with pytest.raises(ValueError, match="--trust-remote-code"):
        Vocab(TIKTOKEN_DIR)


def test_vocab_resolves_kimi_ids_and_samples_words(vocab: Vocab, hf: Any) -> None:
    assert vocab.special["think"] == 163606 and vocab.special["think_end"] == 163607
    assert vocab.special["im_end"] == 163586
    assert vocab.eos_ids == {163585, 163586}  # config eos ∪ generation_config eos ∪ eos_token
    assert vocab.meta.vocab_size == 163840 and vocab.meta.model_type == "kimi_k25"
    assert len(set(vocab.word_pool)) >= 50 and not set(vocab.word_pool) & vocab.added_ids
    words = [hf.decode([i]) for i in set(vocab.word_pool)]
    assert sum(w.startswith(" ") and w[1:].isalpha() for w in words) >= 50
    text = "The weather in Paris is sunny. <think>"
    assert vocab.encode(text) == hf.encode(text, add_special_tokens=False)
    ids = hf.encode("a<|im_end|>b</think>", add_special_tokens=False)
    assert vocab.decode(ids, skip_special_tokens=False) == "a<|im_end|>b</think>"
    assert vocab.decode(ids, skip_special_tokens=True) == hf.decode(ids, skip_special_tokens=True)


def test_fake_model_output_is_kimi_shaped(vocab: Vocab, hf: Any) -> None:
    model = FakeModel(vocab)
    prompt = render(hf, "What is the weather in Paris?", tools=[WEATHER_TOOL])
    for seed in range(20):
        stream = model.generate(prompt, hashlib.sha256(pack_int32(prompt)).digest(), seed, 20000)
        out = stream[: stream.index(163586) + 1]  # up to <|im_end|>
        assert out.count(163607) == 1  # </think> once
        assert out.count(163595) == out.count(163596) <= 1  # tool-call section balanced
        assert all(0 <= i < 163840 for i in out) and not set(out) & {163587, 163588, 163594}


def test_served_over_http_with_trust_remote_code(tmp_path: Path, hf: Any) -> None:
    factory = EmulatorFactory(tmp_path)
    try:
        refused = factory.start(model_path=TIKTOKEN_DIR, wait=False)
        assert refused.proc.wait(60) != 0
        assert "--trust-remote-code" in refused.stderr
        emu = factory.start("--trust-remote-code", model_path=TIKTOKEN_DIR)
        prompt = render(hf, "Think about 1+1.")
        body = {
            "input_ids": prompt,
            "sampling_params": {"max_new_tokens": 2048, "stop_token_ids": [163586, 163585]},
        }
        r = emu.generate(body)
        out = r["output_ids"]
        assert out[-1] == 163586 and out.count(163607) == 1
        assert r["meta_info"]["finish_reason"] == {"type": "stop", "matched": 163586}
        assert r["meta_info"]["prompt_tokens"] == len(prompt)
        assert r["text"] == hf.decode(out, skip_special_tokens=True)
        info = emu.client.get("/model_info").json()
        assert info["model_type"] == "kimi_k25"
    finally:
        factory.stop_all()
