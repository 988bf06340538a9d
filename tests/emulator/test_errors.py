"""400s in SGLang 0.5.23's three body shapes (ValueError, contract, validation)."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from tests.support.emulator import EmulatorProcess

CONTEXT = 8192  # the shared emulator's --context-length


def _error(emu: EmulatorProcess, body: Any) -> Any:
    r = emu.client.post("/generate", content=orjson.dumps(body))
    assert r.status_code == 400, r.text
    return r.json()


def test_empty_input_ids(emu: EmulatorProcess) -> None:
    assert _error(emu, {"input_ids": []}) == {"error": {"message": "input_ids cannot be empty."}}
    assert "should be provided" in _error(emu, {"sampling_params": {}})["error"]["message"]


def test_prompt_longer_than_context(emu: EmulatorProcess) -> None:
    body = _error(emu, {"input_ids": [1] * CONTEXT})
    assert body["error"]["message"] == (
        f"The input ({CONTEXT} tokens) is longer than the model's context length "
        f"({CONTEXT} tokens)."
    )


def test_prompt_plus_max_new_tokens_exceeds_context(emu: EmulatorProcess) -> None:
    n = 100
    body = _error(emu, {"input_ids": [1] * n, "sampling_params": {"max_new_tokens": CONTEXT}})
    msg = body["error"]["message"]
    assert msg.startswith(
        f"Requested token count exceeds the model's maximum context length of {CONTEXT} tokens. "
        f"You requested a total of {n + CONTEXT} tokens: {n} tokens from the input messages "
        f"and {CONTEXT} tokens for the completion."
    )
    ok = emu.generate(
        {
            "input_ids": [1] * n,
            "sampling_params": {"max_new_tokens": CONTEXT - n, "ignore_eos": True},
        }
    )
    # the scheduler still caps the budget at max_req_len - prompt - 1
    assert len(ok["output_ids"]) == CONTEXT - 1 - n - 1


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"top_p": 0}, "top_p must be in (0, 1], got 0.0."),
        ({"temperature": -1}, "temperature must be a non-negative finite number, got -1.0."),
        ({"top_k": 0}, "top_k must be -1 (disable) or at least 1, got 0."),
        ({"min_p": 2}, "min_p must be in [0, 1], got 2.0."),
        ({"max_new_tokens": -1}, "max_new_tokens must be at least 0, got -1."),
        (
            {"repetition_penalty": 3},
            "repetition_penalty must be in (0, 2] (1.0 = no penalty), got 3.0.",
        ),
        (
            {"max_new_tokens": 2, "min_new_tokens": 3},
            "min_new_tokens must be in [0, max_new_tokens(2)], got 3.",
        ),
    ],
)
def test_bad_sampling_values(emu: EmulatorProcess, params: dict[str, Any], message: str) -> None:
    assert _error(emu, {"input_ids": [1, 2], "sampling_params": params}) == {
        "error": {"message": message}
    }


def test_unknown_sampling_key_and_wrong_types(emu: EmulatorProcess) -> None:
    body = _error(emu, {"input_ids": [1, 2], "sampling_params": {"foo": 1}})
    assert isinstance(body["error"], str)
    assert body["error"].startswith("unknown field `foo`, expected one of `max_new_tokens`, `stop`")
    body = _error(emu, {"input_ids": [1, 2], "sampling_params": {"max_new_tokens": "8"}})
    assert body == {"error": 'invalid type: string "8", expected i64'}
    body = _error(emu, {"input_ids": [1, "x"]})
    assert body == {"error": 'invalid type: string "x", expected i64'}


def test_malformed_request_types(emu: EmulatorProcess) -> None:
    for bad in ({"input_ids": "abc"}, {"input_ids": [1], "rid": 5}, [1, 2, 3]):
        body = _error(emu, bad)
        assert body["object"] == "error" and body["type"] == "Bad Request"
        assert body["code"] == 400 and body["param"] is None
    r = emu.client.post("/generate", content=b"{not json")
    assert r.status_code == 400 and r.json()["type"] == "Bad Request"


def test_out_of_vocab_ids_accepted_like_sglang(emu: EmulatorProcess) -> None:
    """SGLang 0.5.23 does not check input ids against the vocabulary: neither does the emulator."""
    for ids in ([1, 10**6], [-5, 2], [2**40, 3]):
        body = emu.generate({"input_ids": ids, "sampling_params": {"max_new_tokens": 2}})
        assert body["meta_info"]["prompt_tokens"] == 2
    assert _error(emu, {"input_ids": [1, 2**63]})["error"] == (
        "invalid type: integer `9223372036854775808`, expected i64"
    )


@pytest.mark.parametrize(
    ("extra", "what"),
    [
        ({"input_ids": [[1, 2], [3, 4]]}, "A list of input_ids lists (batch request)"),
        ({"sampling_params": [{}]}, "A list of sampling_params (batch request)"),
        ({"rid": ["a"]}, "A list of rids (batch request)"),
        ({"text": "hello"}, "'text'"),
        ({"stream": True}, "'stream'"),
        ({"return_prompt_token_ids": True}, "'return_prompt_token_ids'"),
        ({"sampling_params": {"n": 2}}, "n > 1 (parallel sampling)"),
        ({"sampling_params": {"stop": ["\n"]}}, "A stop string (stop, stop_regex)"),
    ],
)
def test_what_the_pipeline_never_sends_is_refused(
    emu: EmulatorProcess, extra: dict[str, Any], what: str
) -> None:
    """Features the pipeline never uses are refused in SGLang's ValueError shape, not faked."""
    body = _error(emu, {"input_ids": [1, 2], **extra})
    assert body == {"error": {"message": f"{what} is not supported by the SGLang emulator."}}


def test_unknown_route_and_method(emu: EmulatorProcess) -> None:
    assert emu.client.get("/nope").status_code == 404
    assert emu.client.get("/nope").json() == {"detail": "Not Found"}
    assert emu.client.get("/generate").status_code == 405
