"""The emulator as a speculating server: SGLang's flags resolved as SGLang resolves them,
``/server_info`` and ``meta_info`` in SGLang's shapes, the acceptance profile followed."""

from __future__ import annotations

from pathlib import Path

import pytest

from eagle3_datagen.sglang.speculative import SpeculativeSettings, parse_spec_meta, summarize
from sglang_emulator.args import build_parser
from sglang_emulator.speculating import (
    SpecSettings,
    SpeculationArgsError,
    Speculator,
    parse_profile,
    resolve_settings,
)
from sglang_emulator.speculation import AcceptanceProfile, SpecCounters
from tests.support.emulator import EmulatorFactory


def _ns(*flags: str):
    return build_parser().parse_args(["--model-path", "m", *flags])


def test_flags_resolved_as_sglang(tmp_path: Path) -> None:
    draft = str(tmp_path)
    # Lower case is upper-cased; topk 1 forces draft tokens to steps + 1.
    ns = _ns(
        "--speculative-algorithm", "eagle3", "--speculative-draft-model-path", draft,
        "--speculative-num-steps", "4", "--speculative-eagle-topk", "1",
        "--speculative-num-draft-tokens", "9",
    )  # fmt: skip
    assert resolve_settings(ns, "KimiK25ForConditionalGeneration") == SpecSettings(
        "EAGLE3", draft, 4, 1, 5
    )
    # No steps: SGLang's automatic choice, by architecture.
    auto = _ns("--speculative-algorithm", "EAGLE3", "--speculative-draft-model", draft)
    assert resolve_settings(auto, "LlamaForCausalLM") == SpecSettings("EAGLE3", draft, 5, 4, 8)
    assert resolve_settings(auto, "Qwen3ForCausalLM") == SpecSettings("EAGLE3", draft, 3, 1, 4)
    nextn = _ns("--speculative-algorithm", "nextn", "--speculative-draft-model-path", draft)
    assert resolve_settings(nextn, "X").algorithm == "EAGLE"  # type: ignore[union-attr]
    assert resolve_settings(_ns(), "X") is None


@pytest.mark.parametrize(
    ("flags", "error"),
    [
        (["--speculative-draft-model-path", "{missing}"], "not a readable directory"),
        (["--speculative-draft-model-path", "{file}"], "not a readable directory"),
        ([], "needs a draft model path"),
        (["--speculative-draft-model-path", "{dir}", "--speculative-num-steps", "3"], "topk"),
    ],
)
def test_flags_refused(tmp_path: Path, flags: list[str], error: str) -> None:
    (tmp_path / "file").write_text("x")
    paths = {"missing": tmp_path / "nope", "file": tmp_path / "file", "dir": tmp_path}
    ns = _ns("--speculative-algorithm", "EAGLE3", *(f.format(**paths) for f in flags))
    with pytest.raises(SpeculationArgsError, match=error):
        resolve_settings(ns, "X")


def test_profile_flags() -> None:
    assert parse_profile(None, "0.9,0.5", 3) == AcceptanceProfile((0.9, 0.5))
    mean = parse_profile(3.0, None, 3).mean_accept_length(3)
    assert mean == pytest.approx(3.0)
    with pytest.raises(SpeculationArgsError, match="not both"):
        parse_profile(3.0, "0.5", 3)
    with pytest.raises(SpeculationArgsError, match=r"\[1, 4\]"):
        parse_profile(5.0, None, 3)


def test_meta_info_by_sglang_formulas() -> None:
    # 11 tokens: 1 from prefill, then verify steps accepting 2, 0, 3, 1 drafts (3+1+4+2 = 10).
    spec = Speculator(SpecSettings("EAGLE3", "d", 3, 1, 4), AcceptanceProfile((0.5,)))
    fields = spec.finish(SpecCounters(11, 4, 6, (1, 1, 1, 1)))
    assert fields == {
        "spec_accept_rate": 6 / 12,  # correct / (verify_ct * (draft tokens - 1))
        "spec_accept_length": 11 / 4,  # completion tokens / verify_ct
        "spec_num_correct_drafts": 6,
        "spec_num_proposed_drafts": 12,
        "spec_verify_ct": 4,
        "spec_correct_drafts_histogram": [1, 1, 1, 1],
    }
    assert spec.finish(SpecCounters(1, 0, 0, ())) == {}  # prefill only: no field at all
    # Server-wide: (correct + verify steps) / verify steps.
    assert spec.internal_state() == {"avg_spec_accept_length": (6 + 4) / 4}


def test_speculating_emulator(emu_factory: EmulatorFactory, tmp_path: Path) -> None:
    emu = emu_factory.start(
        "--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", str(tmp_path),
        "--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
        "--speculative-num-draft-tokens", "4", "--emu-accept-length", "2.5",
        "--emu-mean-output-tokens", "120", "--random-seed", "0",
    )  # fmt: skip
    info = emu.client.get("/server_info").json()
    settings = SpeculativeSettings.from_server_info(info)
    assert (settings.algorithm, settings.num_steps, settings.num_draft_tokens) == ("EAGLE3", 3, 4)
    assert settings.draft_model_path == str(tmp_path)
    assert (settings.accept_threshold_single, settings.accept_threshold_acc) == (1.0, 1.0)
    assert info["max_running_requests"] == 48  # SGLang's default under speculation
    assert "avg_spec_accept_length" not in info["internal_states"][0]  # no verify step yet
    stats = []
    for i in range(40):
        body = {"input_ids": [5, 6, 7, i], "sampling_params": {"max_new_tokens": 400}}
        out = emu.generate(body)
        again = emu.generate(body)
        assert again["meta_info"]["spec_verify_ct"] == out["meta_info"]["spec_verify_ct"]
        parsed = parse_spec_meta(out["meta_info"], settings)
        assert parsed is not None
        assert parsed.completion_tokens == len(out["output_ids"])
        stats.append(parsed)
    pooled = summarize(stats, num_positions=3)
    assert pooled.accept_length == pytest.approx(2.5, abs=0.25)
    server = emu.client.get("/server_info").json()["internal_states"][0]
    # Every request was sent twice with the same counters: the server-wide figure is the same.
    assert server["avg_spec_accept_length"] == pytest.approx(pooled.accept_length)


def test_plain_emulator_reports_no_speculation(emu_factory: EmulatorFactory) -> None:
    emu = emu_factory.start("--random-seed", "0")
    info = emu.client.get("/server_info").json()
    assert info["speculative_algorithm"] is None
    assert not SpeculativeSettings.from_server_info(info).is_speculating
    meta = emu.generate({"input_ids": [5, 6, 7], "sampling_params": {"max_new_tokens": 50}})
    assert not [k for k in meta["meta_info"] if k.startswith("spec_")]


def test_missing_draft_dir_fails_startup(emu_factory: EmulatorFactory, tmp_path: Path) -> None:
    emu = emu_factory.start(
        "--speculative-algorithm", "EAGLE3",
        "--speculative-draft-model-path", str(tmp_path / "absent"), wait=False,
    )  # fmt: skip
    assert emu.proc.wait(30) == 1
    assert "not a readable directory" in emu.stderr
