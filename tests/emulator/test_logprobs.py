"""``return_logprob`` against a real emulator process: SGLang 0.5.23's fields and shapes
(tokenizer_manager.py, add_logprob_to_meta_info), deterministic per request, the sampled
token's logprob equal to its top-K entry, the tokens the same as without logprobs."""

from __future__ import annotations

import math
from typing import Any

import orjson

from sglang_emulator.logprobs import NO_MASS
from tests.support.emulator import EmulatorProcess

SP = {"max_new_tokens": 48, "sampling_seed": 3, "temperature": 0.8}


def _ask(emu: EmulatorProcess, prompt: list[int], **fields: Any) -> Any:
    return emu.generate({"input_ids": prompt, "sampling_params": SP, **fields})


def test_the_logprob_fields_come_in_sglang_s_shapes(
    emu: EmulatorProcess, prompt: list[int]
) -> None:
    out = _ask(emu, prompt, return_logprob=True, top_logprobs_num=4, logprob_start_len=-1)
    meta, ids = out["meta_info"], out["output_ids"]
    keys = list(meta)
    # After num_retractions, before the token counts, as tokenizer_manager.py adds them.
    at = keys.index("num_retractions")
    assert keys[at + 1 : at + 6] == [
        "input_token_logprobs",
        "output_token_logprobs",
        "output_token_logprobs_length",
        "input_top_logprobs",
        "output_top_logprobs",
    ]
    assert meta["input_token_logprobs"] == [] and meta["input_top_logprobs"] == []
    assert meta["output_token_logprobs_length"] == len(ids)
    assert [t[1] for t in meta["output_token_logprobs"]] == ids
    assert all(t[2] is None and math.isfinite(t[0]) for t in meta["output_token_logprobs"])
    for (lp, token, _), row in zip(
        meta["output_token_logprobs"], meta["output_top_logprobs"], strict=True
    ):
        assert len(row) == 4 and all(len(t) == 3 and t[2] is None for t in row)
        values = [t[0] for t in row]
        assert values == sorted(values, reverse=True)
        top_ids = [t[1] for t in row]
        assert len(set(top_ids)) == 4
        assert values[0] > NO_MASS and lp > NO_MASS  # the sampled token had mass
        if token in top_ids:
            assert values[top_ids.index(token)] == lp
        else:
            assert lp <= values[-1]
    # Some rows are peaked, their zero-probability entries clamped as SGLang sends them.
    assert any(t[0] == NO_MASS for row in meta["output_top_logprobs"] for t in row)
    # The same request again: the same numbers. Without logprobs: the same tokens.
    again = _ask(emu, prompt, return_logprob=True, top_logprobs_num=4)["meta_info"]
    assert again["output_top_logprobs"] == meta["output_top_logprobs"]
    assert again["output_token_logprobs"] == meta["output_token_logprobs"]
    assert _ask(emu, prompt)["output_ids"] == ids


def test_top_k_zero_and_text(emu: EmulatorProcess, prompt: list[int], hf_tokenizer: Any) -> None:
    out = _ask(emu, prompt, return_logprob=True, return_text_in_logprobs=True)
    meta = out["meta_info"]
    assert "output_top_logprobs" not in meta and "input_top_logprobs" not in meta
    assert [t[2] for t in meta["output_token_logprobs"]] == [
        hf_tokenizer.decode([t], skip_special_tokens=False) for t in out["output_ids"]
    ]
    plain = _ask(emu, prompt)["meta_info"]
    assert "output_token_logprobs" not in plain


def test_greedy_samples_the_top_token(emu: EmulatorProcess, prompt: list[int]) -> None:
    body = {"input_ids": prompt, "sampling_params": {"max_new_tokens": 24, "temperature": 0}}
    meta = emu.generate({**body, "return_logprob": True, "top_logprobs_num": 2})["meta_info"]
    for (_, token, _), row in zip(
        meta["output_token_logprobs"], meta["output_top_logprobs"], strict=True
    ):
        assert row[0][1] == token
        assert all(t[0] > NO_MASS for t in row)  # log_softmax: never -inf, nothing clamped


def test_prompt_logprobs_are_refused(emu: EmulatorProcess, prompt: list[int]) -> None:
    body = {"input_ids": prompt, "return_logprob": True, "logprob_start_len": 0}
    r = emu.client.post("/generate", content=orjson.dumps(body))
    assert r.status_code == 400 and "logprob_start_len" in r.text
    # Without return_logprob SGLang ignores logprob_start_len (scheduler.py).
    assert emu.generate({"input_ids": prompt, "logprob_start_len": 0, "sampling_params": SP})
