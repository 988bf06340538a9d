"""Pure unit tests: the launch command, redaction, the API key, the length rule, pidfiles."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from eagle3_datagen.config import LaunchFlags, ModelSpec, ServerSpec
from eagle3_datagen.errors import ConfigError
from eagle3_datagen.sglang.health import log_tail
from eagle3_datagen.sglang.launch_command import (
    build_launch_command,
    format_command,
    resolve_api_key,
)
from eagle3_datagen.sglang.orphans import ServerRecord, pidfile_path, read_record, write_record
from eagle3_datagen.sglang.preflight import ServerFacts, sanitize
from eagle3_datagen.sglang.process import server_log_path, server_state_dir
from eagle3_datagen.sglang.redact import is_secret_name, redact_text
from eagle3_datagen.sglang.redact import redact_argv as redacted

PY = "/usr/bin/python3"


def test_default_command_is_the_seed_command() -> None:
    cmd = build_launch_command(ServerSpec(), ModelSpec(path="/models/Kimi-K2.5"), PY)
    assert shlex.join(cmd) == (
        "/usr/bin/python3 -m sglang.launch_server --model-path /models/Kimi-K2.5 --tp-size 8 "
        "--mem-fraction-static 0.88 --enable-hierarchical-cache --hicache-size 48 "
        "--num-continuous-decode-steps 4 --trust-remote-code --host 127.0.0.1 --port 8000 "
        "--random-seed 0"
    )


def test_optional_flags_follow_in_order() -> None:
    server = ServerSpec(
        engine="emulator",
        port=9001,
        context_length=32768,
        extra_args=["--max-running-requests", "256", "--enable-metrics"],
    )
    model = ModelSpec(path="moonshotai/Kimi-K2.5", tokenizer_path="/tok")
    cmd = build_launch_command(server, model, PY, api_key="sk-secret")
    assert shlex.join(cmd) == (
        "/usr/bin/python3 -m sglang_emulator --model-path moonshotai/Kimi-K2.5 "
        "--tp-size 8 --mem-fraction-static 0.88 --enable-hierarchical-cache --hicache-size 48 "
        "--num-continuous-decode-steps 4 --trust-remote-code --host 127.0.0.1 --port 9001 "
        "--tokenizer-path /tok --context-length 32768 --random-seed 0 --max-running-requests 256 "
        "--enable-metrics --api-key sk-secret"
    )
    shown = format_command(cmd)
    assert "sk-secret" not in shown
    assert shown.endswith("--enable-metrics --api-key '***'")


def test_hicache_off_and_no_remote_code() -> None:
    launch = LaunchFlags(enable_hierarchical_cache=False, tp_size=1, mem_fraction_static=0.9)
    server = ServerSpec(launch=launch)
    cmd = build_launch_command(server, ModelSpec(path="m", trust_remote_code=False), PY)
    assert shlex.join(cmd) == (
        "/usr/bin/python3 -m sglang.launch_server --model-path m --tp-size 1 "
        "--mem-fraction-static 0.9 --num-continuous-decode-steps 4 --host 127.0.0.1 --port 8000 "
        "--random-seed 0"
    )


@pytest.mark.parametrize("bad", [["--reasoning-parser", "kimi_k2"], ["--reasoning-parser=kimi"]])
def test_reasoning_parser_refused_even_if_validation_is_bypassed(bad: list[str]) -> None:
    with pytest.raises(ValueError, match="reasoning-parser"):
        ServerSpec(extra_args=bad)
    server = ServerSpec.model_construct(**{**ServerSpec().model_dump(), "extra_args": bad})
    with pytest.raises(ConfigError, match="--reasoning-parser"):
        build_launch_command(server, ModelSpec(path="m"), PY)


def test_redacted_forms() -> None:
    cmd = [
        "x",
        "--api-key",
        "K1",
        "--admin-api-key=K2",
        "--hf-token",
        "K3",
        "--max-total-tokens",
        "5",
        "--tokenizer-path",
        "/t",
        "--foo",
        "prefix-K4-suffix",
    ]
    assert redacted(cmd, secrets=["K4"]) == [
        "x",
        "--api-key",
        "***",
        "--admin-api-key=***",
        "--hf-token",
        "***",
        "--max-total-tokens",
        "5",
        "--tokenizer-path",
        "/t",
        "--foo",
        "prefix-***-suffix",
    ]
    text = "python -m sglang.launch_server --api-key K1 --max-total-tokens 5 --hf-token=K3"
    assert redact_text(text) == (
        "python -m sglang.launch_server --api-key *** --max-total-tokens 5 --hf-token=***"
    )


def test_resolve_api_key(monkeypatch: pytest.MonkeyPatch) -> None:
    assert resolve_api_key(ServerSpec()) is None
    monkeypatch.delenv("E3_TEST_KEY", raising=False)
    with pytest.raises(ConfigError, match="E3_TEST_KEY"):
        resolve_api_key(ServerSpec(api_key_env="E3_TEST_KEY"))
    monkeypatch.setenv("E3_TEST_KEY", "sk-1")
    assert resolve_api_key(ServerSpec(api_key_env="E3_TEST_KEY")) == "sk-1"


def _facts(ctx: int, max_req: int | None = None) -> ServerFacts:
    return ServerFacts(
        context_length=ctx,
        context_length_source="test",
        version=None,
        server_args={},
        model_info={},
        max_req_input_len=max_req,
    )


def test_fits_follows_sglang_rule() -> None:
    facts = _facts(100)
    assert facts.fits(10, 90) is None  # exactly the context: allowed (v0.5.23 rule: > C)
    assert facts.fits(99, 1) is None
    assert "exceeds the context length (100" in (facts.fits(10, 91) or "")
    assert "not shorter than the context length" in (facts.fits(100, 0) or "")
    assert facts.fits(101, 1) is not None
    limited = _facts(100, max_req=50)
    assert limited.fits(49, 10) is None
    assert "max_req_input_len (50" in (limited.fits(50, 10) or "")


def test_secret_names_and_sanitize() -> None:
    for name in (
        "api_key",
        "admin_api_key",
        "hf_token",
        "ssl_keyfile_password",
        "client_secret",
        "auth_token",
    ):
        assert is_secret_name(name), name
    for name in (
        "max_total_num_tokens",
        "max_total_tokens",
        "max_prefill_tokens",
        "tokenizer_path",
        "skip_tokenizer_init",
        "tp_size",
        "context_length",
        "speculative_num_draft_tokens",
        "max_req_input_len",
        "kv_cache_dtype",
        "--emu-decode-ms-per-token",  # a unit, not a credential
    ):
        assert not is_secret_name(name), name
    info = {
        "api_key": "sk-1",
        "tp_size": 8,
        "max_total_num_tokens": 1000,
        "launch_command": "python -m sglang.launch_server --api-key sk-1 --tp 8",
        "internal_states": [{"api_key": "sk-1", "admin_api_key": None, "tp_size": 8}],
        "note": "uses sk-1",
    }
    clean = sanitize(info, ("sk-1",))
    assert "sk-1" not in repr(clean)
    assert clean["tp_size"] == 8 and clean["max_total_num_tokens"] == 1000
    assert clean["internal_states"] == [{"tp_size": 8}]
    assert clean["launch_command"] == "python -m sglang.launch_server --api-key *** --tp 8"


def test_log_tail_handles_carriage_returns(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    log.write_bytes(
        b"old run\nLoading safetensors checkpoint shards:   0% 0/64\r"
        b"Loading safetensors checkpoint shards:  50% 32/64\r\n\n   \n"
    )
    assert log_tail(log, 1) == ["Loading safetensors checkpoint shards:  50% 32/64"]
    assert log_tail(log, 50, offset=len(b"old run\n"))[0].endswith("0% 0/64")
    assert log_tail(tmp_path / "missing.log") == []


def test_paths_and_pidfile_roundtrip(tmp_path: Path) -> None:
    assert server_state_dir(tmp_path) == tmp_path / ".state" / "servers"
    assert server_log_path(tmp_path, 8000) == tmp_path / "logs" / "server-8000.log"
    path = pidfile_path(tmp_path, "flow/run id:1")
    assert path == tmp_path / "flow_run_id_1.json"
    record = ServerRecord(1, 1, 2, 3, 4, "flow/run id:1", ["x", "--api-key", "***"], "t", "l")
    write_record(path, record)
    assert read_record(path) == record
    path.write_text("{not json")
    assert read_record(path) is None
