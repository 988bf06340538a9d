"""SGLang's logprob fields parsed as 0.5.23 sends them, the checks of a record's logprob
columns, and the entropy estimate from a top-K."""

from __future__ import annotations

import math
from typing import Any

import pytest

from eagle3_datagen.errors import RetryableRequestError
from eagle3_datagen.sglang.client import GenerateResult
from eagle3_datagen.sglang.logprobs import (
    entropy_summary,
    parse_logprobs,
    request_fields,
    token_entropy,
)
from eagle3_datagen.validate.logprobs import check_logprobs
from eagle3_datagen.validate.tokens import Verdict


def _answer(**meta: Any) -> dict[str, Any]:
    """A /generate body as SGLang 0.5.23 writes it with return_logprob and top_logprobs_num=2:
    tokenizer_manager.py's add_logprob_to_meta_info puts the (logprob, id, text) tuples after
    num_retractions; orjson writes tuples as arrays. A probability that underflowed to 0 comes
    clamped to float32's lowest value (layers/logprob_processor.py:926; recorded from SGLang's
    own code in tests/fixtures/sglang-0.5.23/generate_logprobs_top3_stop.json)."""
    return {
        "text": "ab",
        "output_ids": [11, 12, 2],
        "meta_info": {
            "id": "rid-1",
            "finish_reason": {"type": "stop", "matched": 2},
            "prompt_tokens": 4,
            "weight_version": "default",
            "num_retractions": 0,
            "input_token_logprobs": [],
            "output_token_logprobs": [[-0.25, 11, None], [-1.5, 12, None], [-0.01, 2, None]],
            "output_token_logprobs_length": 3,
            "input_top_logprobs": [],
            "output_top_logprobs": [
                [[-0.25, 11, None], [-1.75, 40, None]],
                [[-0.5, 41, None], [-1.5, 12, None]],
                [[-0.01, 2, None], [-3.4028234663852886e38, 43, None]],  # underflowed to 0
            ],
            "completion_tokens": 3,
            "cached_tokens": 0,
            "e2e_latency": 0.2,
            **meta,
        },
    }


def test_the_request_asks_for_output_logprobs_only() -> None:
    assert request_fields(20) == {
        "return_logprob": True,
        "logprob_start_len": -1,
        "top_logprobs_num": 20,
    }


def test_an_sglang_answer_is_parsed_as_sent() -> None:
    result = GenerateResult.from_json(_answer(), top_k=2)
    assert result.output_logprobs == [-0.25, -1.5, -0.01]
    assert result.logprob_ids == [11, 12, 2]
    assert result.top_logprob_ids == [[11, 40], [41, 12], [2]]  # the clamped entry dropped
    assert result.top_logprobs == [[-0.25, -1.75], [-0.5, -1.5], [-0.01]]
    plain = GenerateResult.from_json(_answer())  # not asked: nothing parsed
    assert plain.output_logprobs is None and plain.top_logprobs is None


def test_a_null_top_k_entry_is_dropped_too() -> None:
    """orjson writes a NaN logprob as null: no usable mass either."""
    answer = _answer()
    answer["meta_info"]["output_top_logprobs"][1][1][0] = None
    result = GenerateResult.from_json(answer, top_k=2)
    assert result.top_logprob_ids == [[11, 40], [41], [2]]


def test_top_k_zero_reads_only_the_sampled_token_s_logprob() -> None:
    answer = _answer()
    del answer["meta_info"]["output_top_logprobs"]  # SGLang sends none with K = 0
    parsed = parse_logprobs(answer["meta_info"], 0)
    assert parsed.logprobs == [-0.25, -1.5, -0.01] and parsed.top_ids is None


def test_an_answer_missing_the_asked_fields_is_a_server_fault() -> None:
    answer = _answer()
    del answer["meta_info"]["output_top_logprobs"]
    with pytest.raises(RetryableRequestError, match="output_top_logprobs"):
        GenerateResult.from_json(answer, top_k=2)


def test_an_abort_without_logprobs_still_parses() -> None:
    answer = _answer(finish_reason={"type": "abort", "message": "Abort in waiting queue"})
    for key in ("output_token_logprobs", "output_top_logprobs", "input_token_logprobs"):
        del answer["meta_info"][key]
    result = GenerateResult.from_json(answer, top_k=2)
    assert result.finish_type == "abort" and result.output_logprobs is None


def _verdict(output: list[int], logprobs: Any, **kw: Any) -> Verdict:
    v = Verdict()
    check_logprobs(output, logprobs, v, **kw)
    return v


def test_consistent_columns_pass() -> None:
    r = GenerateResult.from_json(_answer(), top_k=2)
    v = _verdict(
        r.output_ids, r.output_logprobs, scored_ids=r.logprob_ids,
        top_ids=r.top_logprob_ids, top_logprobs=r.top_logprobs, top_k=2,
    )  # fmt: skip
    assert v.accepted, v.reason_text


@pytest.mark.parametrize(
    ("logprobs", "kw", "code"),
    [
        ([-0.1, -0.2], {}, "logprobs_length"),
        (None, {}, "logprobs_length"),
        ([-0.1, None, -0.3], {}, "logprob_not_finite"),
        ([-0.1, math.nan, -0.3], {}, "logprob_not_finite"),
        ([-0.1, 0.5, -0.3], {}, "logprob_not_finite"),  # a probability above 1
        ([-0.1, -0.2, -0.3], {"scored_ids": [11, 99, 2]}, "logprobs_ids"),
        (
            [-0.1, -0.2, -0.3],
            {"top_ids": [[11], [12]], "top_logprobs": [[-0.1], [-0.2]], "top_k": 1},
            "top_logprobs_length",
        ),
        (
            [-0.1, -0.2, -0.3],
            {"top_ids": [[11], [12], [2]], "top_logprobs": [[-0.1], [-0.9], [-0.3]], "top_k": 1},
            "logprob_mismatch",  # the sampled token's own top-K entry says otherwise
        ),
        (
            [-0.1, -0.2, -0.3],
            {"top_ids": [[11], [7], [2]], "top_logprobs": [[-0.1], [-0.5], [-0.3]], "top_k": 1},
            "logprob_mismatch",  # likelier than the whole top-K yet not in it
        ),
        (
            [-0.1, -0.2, -0.3],
            {
                "top_ids": [[11], [12], [2]],
                "top_logprobs": [[-0.1], [-0.2], [math.inf]],
                "top_k": 1,
            },
            "logprob_not_finite",
        ),
    ],
)
def test_broken_columns_are_refused_with_a_reason(
    logprobs: Any, kw: dict[str, Any], code: str
) -> None:
    v = _verdict([11, 12, 2], logprobs, **kw)
    assert [c for c, _ in v.reasons] == [code]


def test_the_entropy_estimate_is_exact_without_a_tail_and_a_lower_bound_with_one() -> None:
    assert token_entropy([math.log(0.25)] * 4) == pytest.approx(math.log(4))
    p = 0.7  # K = 1: the binary entropy of the top token
    assert token_entropy([math.log(p)]) == pytest.approx(-p * math.log(p) - 0.3 * math.log(0.3))
    full = [0.4, 0.2] + [0.4 / 40] * 40  # the true distribution: a long flat tail
    truth = -sum(q * math.log(q) for q in full)
    estimate = token_entropy([math.log(0.4), math.log(0.2)])
    assert estimate < truth
    assert token_entropy([0.0]) == 0.0  # certain: no entropy


def test_the_summary_is_the_mean_and_the_nearest_rank_p90() -> None:
    rows = [[math.log(0.5), math.log(0.5)]] * 9 + [[0.0]]  # nine coin flips, one certainty
    summary = entropy_summary(rows)
    assert summary is not None
    assert summary.mean == pytest.approx(0.9 * math.log(2))
    assert summary.p90 == pytest.approx(math.log(2))
    assert entropy_summary([]) is None
