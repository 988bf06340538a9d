"""Speculative settings, per-request counters and their summaries, on SGLang 0.5.23's recorded
``/server_info`` and ``/generate`` bodies, with hand-computed numbers."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from eagle3_datagen.errors import ServerError
from eagle3_datagen.sglang.speculative import (
    SpecRequestStats,
    SpeculativeSettings,
    length_bucket,
    lossy_reasons,
    parse_spec_meta,
    server_accept_lengths,
    summarize,
    summarize_by,
)

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "sglang-0.5.23"


def _recorded(name: str) -> dict[str, Any]:
    return json.loads((FIXTURES / name).read_text())["response"]["body"]


def _eagle3(**changes: Any) -> dict[str, Any]:
    """The recorded /server_info as a GPU server running EAGLE3 (3 steps, topk 1) would show it."""
    info = _recorded("server_info.json")
    info.update(
        device="cuda",
        speculative_algorithm="EAGLE3",
        speculative_draft_model_path="org/draft",
        speculative_num_steps=3,
        speculative_eagle_topk=1,
        speculative_num_draft_tokens=4,
    )
    info.update(changes)
    return info


def test_the_recorded_server_does_not_speculate():
    settings = SpeculativeSettings.from_server_info(_recorded("server_info.json"))
    assert settings.version == "0.5.23" and not settings.is_speculating
    assert (settings.accept_threshold_single, settings.accept_threshold_acc) == (1.0, 1.0)
    assert lossy_reasons(_recorded("server_info.json")) == []
    # No spec counters at all, not zeros.
    assert parse_spec_meta(_recorded("generate_success.json")["meta_info"], settings) is None


def test_settings_of_an_eagle3_server():
    settings = SpeculativeSettings.from_server_info(_eagle3())
    assert settings.is_speculating and settings.algorithm == "EAGLE3"
    assert (settings.num_steps, settings.eagle_topk, settings.num_draft_tokens) == (3, 1, 4)
    assert settings.draft_model_path == "org/draft"
    assert lossy_reasons(_eagle3()) == []


def test_a_missing_server_field_names_field_and_version():
    info = _eagle3(version="0.9.0")
    del info["speculative_accept_threshold_acc"]
    with pytest.raises(
        ServerError, match=r"SGLang 0\.9\.0 has no 'speculative_accept_threshold_acc'"
    ):
        SpeculativeSettings.from_server_info(info)


def test_thresholds_below_one_are_lossy():
    reasons = lossy_reasons(
        _eagle3(speculative_accept_threshold_single=0.9, speculative_accept_threshold_acc=0.5)
    )
    assert len(reasons) == 2
    assert reasons[0].startswith("speculative_accept_threshold_single=0.9 < 1.0")
    assert reasons[1].startswith("speculative_accept_threshold_acc=0.5 < 1.0")
    # A server that does not speculate never applies them.
    assert (
        lossy_reasons(_recorded("server_info.json") | {"speculative_accept_threshold_acc": 0.5})
        == []
    )


@pytest.mark.parametrize(
    ("env", "lossy"),
    [
        ({"SGLANG_SIMULATE_ACC_LEN": "2.5"}, True),
        ({"SGLANG_SIMULATE_ACC_LEN": "-1"}, False),  # SGLang's default: off
        ({"SGLANG_SIMULATE_ACC_LEN": "oops"}, False),  # SGLang warns and keeps the default
        ({"SGLANG_SIMULATE_ACC_LEN": "3", "SGL_SIMULATE_ACC_LEN": "0"}, False),  # SGL_ wins
        ({"SGL_SIMULATE_ACC_LEN": "3"}, True),
    ],
)
def test_simulated_acceptance_from_the_launch_environment(env, lossy):
    reasons = lossy_reasons(_eagle3(), env=env)
    assert bool(reasons) is lossy
    if lossy:
        assert "SIMULATE_ACC_LEN=" in reasons[0] and "simulated" in reasons[0]


def test_simulated_acceptance_the_server_itself_exposes():
    info = _eagle3()
    info["internal_states"][0]["env_vars"] = {"SGLANG_SIMULATE_ACC_LEN": "3"}
    assert lossy_reasons(info) == [
        "SGLANG_SIMULATE_ACC_LEN=3: accept lengths are forced to a simulated value, not verified"
    ]


def test_request_knobs_and_the_greedy_verify_of_cpu_servers():
    sampling = {"temperature": 0.7, "min_p": 0.05, "repetition_penalty": 1.0,
                "frequency_penalty": 0.5}  # fmt: skip
    reasons = lossy_reasons(_eagle3(), sampling=sampling)
    assert [r.split(":")[0] for r in reasons] == ["min_p > 0", "frequency_penalty=0.5"]
    on_cpu = _eagle3(device="cpu")
    assert lossy_reasons(on_cpu)[0].startswith("device=cpu")
    assert lossy_reasons(on_cpu, sampling={"temperature": 0.0}) == []  # argmax is greedy's rule
    assert lossy_reasons(on_cpu, sampling={"temperature": 1e-7}) == []  # SGLang: greedy too


def _spec_meta(**spec: Any) -> dict[str, Any]:
    meta = dict(_recorded("generate_success.json")["meta_info"])  # 64 completion tokens
    meta.update(spec)
    return meta


# 64 tokens: 1 from prefill, then 20 verify steps with 0,1,2,3 correct drafts 3,2,2,13 times:
# 0*3 + 1*2 + 2*2 + 3*13 = 45 correct drafts, 45 + 20 = 65 tokens accepted, so with the prefill
# token the last step overshot max_new_tokens by 2 (SGLang counts the whole step).
SPEC = {
    "spec_accept_rate": 45 / 60,
    "spec_accept_length": 64 / 20,
    "spec_num_correct_drafts": 45,
    "spec_num_proposed_drafts": 60,
    "spec_verify_ct": 20,
    "spec_correct_drafts_histogram": [3, 2, 2, 13],
}


def test_parse_the_counters_of_one_request():
    stats = parse_spec_meta(_spec_meta(**SPEC), SpeculativeSettings.from_server_info(_eagle3()))
    assert stats == SpecRequestStats(
        verify_ct=20,
        num_correct_drafts=45,
        num_proposed_drafts=60,
        completion_tokens=64,
        correct_drafts_histogram=(3, 2, 2, 13),
        accept_length=3.2,
        accept_rate=0.75,
    )


def test_a_request_without_verify_steps_has_true_zeros():
    settings = SpeculativeSettings.from_server_info(_eagle3())
    one = _spec_meta(completion_tokens=1)
    assert parse_spec_meta(one, settings) == SpecRequestStats(0, 0, 0, 1, ())
    two_after_a_retraction = _spec_meta(completion_tokens=2, num_retractions=1)
    assert parse_spec_meta(two_after_a_retraction, settings) == SpecRequestStats(0, 0, 0, 2, ())


def test_missing_fields_are_an_error_naming_them_and_the_version():
    settings = SpeculativeSettings.from_server_info(_eagle3(version="0.4.9"))
    with pytest.raises(ServerError, match=r"SGLang 0\.4\.9 running EAGLE3 has no spec_verify_ct"):
        parse_spec_meta(_spec_meta(), settings)  # 64 tokens, no field
    older = _spec_meta(spec_verify_ct=20, spec_accept_token_num=33, spec_accept_histogram=[5])
    expected = (
        r"no spec_num_correct_drafts, spec_correct_drafts_histogram "
        r"\(it has \['spec_accept_token_num', 'spec_accept_histogram'\]"
    )
    with pytest.raises(ServerError, match=expected):
        parse_spec_meta(older, settings)


def test_inconsistent_counters_are_an_error():
    settings = SpeculativeSettings.from_server_info(_eagle3())
    bad = _spec_meta(**(SPEC | {"spec_num_correct_drafts": 44}))
    with pytest.raises(ServerError, match="counts 20 verify steps and 45 correct drafts"):
        parse_spec_meta(bad, settings)


def test_summary_pools_counters_then_divides():
    a = SpecRequestStats(4, 6, 12, 11, (1, 0, 1, 2))  # steps with 0,2,3,3 correct drafts
    b = SpecRequestStats(2, 1, 6, 3, (1, 1))  # steps with 0,1
    s = summarize([a, b])
    assert (s.requests, s.verify_ct, s.num_correct_drafts, s.num_proposed_drafts) == (2, 6, 7, 18)
    assert s.correct_drafts_histogram == (2, 1, 1, 2)
    assert s.accept_length == pytest.approx((7 + 6) / 6)  # server-wide: drafts + bonus per step
    assert s.tokens_per_verify == pytest.approx(14 / 6)
    assert s.accept_rate == pytest.approx(7 / 18)
    # Position 1 accepted in 4 of 6 steps, position 2 in 3, position 3 in 2.
    assert s.position_reached == pytest.approx((4 / 6, 3 / 6, 2 / 6))
    assert s.position_conditional == pytest.approx((4 / 6, 3 / 4, 2 / 3))


def test_summary_pads_positions_and_handles_nothing():
    s = summarize([SpecRequestStats(2, 1, 6, 4, (1, 1))], num_positions=3)
    assert s.correct_drafts_histogram == (1, 1, 0, 0)
    assert s.position_reached == (0.5, 0.0, 0.0)
    assert s.position_conditional == (0.5, 0.0, None)
    empty = summarize([])
    assert (empty.requests, empty.accept_length, empty.accept_rate, empty.position_reached) == (
        0, None, None, ())  # fmt: skip


def test_summaries_by_slice_key():
    a = SpecRequestStats(4, 6, 12, 11, (1, 0, 1, 2))
    b = SpecRequestStats(2, 1, 6, 3, (1, 1))
    c = SpecRequestStats(1, 3, 3, 4, (0, 0, 0, 1))
    by = summarize_by([(("p1", True), a), (("p2", False), b), (("p1", True), c)])
    assert list(by) == [("p1", True), ("p2", False)]
    assert by[("p1", True)].verify_ct == 5 and by[("p1", True)].accept_length == pytest.approx(
        (9 + 5) / 5
    )
    assert by[("p2", False)].accept_rate == pytest.approx(1 / 6)


@pytest.mark.parametrize(
    ("n", "label"), [(0, "<128"), (127, "<128"), (128, "128-511"), (511, "128-511"),
                     (512, "512-2047"), (2048, ">=2048")],
)  # fmt: skip
def test_length_buckets(n, label):
    assert length_bucket(n, (128, 512, 2048)) == label


def test_length_bucket_edges_must_ascend():
    with pytest.raises(ValueError, match="ascending"):
        length_bucket(3, (512, 128))


def test_server_accept_lengths_per_rank():
    info = _eagle3()
    assert server_accept_lengths(info) == []  # no decode interval logged yet
    info["internal_states"] = [{"avg_spec_accept_length": 2.5}, {}, {"avg_spec_accept_length": 3}]
    assert server_accept_lengths(info) == [2.5, 3.0]
