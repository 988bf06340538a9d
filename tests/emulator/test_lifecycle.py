"""Startup phases, death during startup, api key, and the info endpoints."""

from __future__ import annotations

import subprocess
import sys
import time

import httpx
import pytest

from tests.support import TOKENIZER_DIR
from tests.support.emulator import EmulatorFactory, EmulatorProcess


def test_startup_phases_refused_then_503_then_ready(emu_factory: EmulatorFactory) -> None:
    emu = emu_factory.start(
        "--emu-startup-refuse-s", "1.0", "--emu-startup-503-s", "1.0", wait=False
    )
    seen: list[str] = []
    generate_ok_while_starting = False
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        try:
            status = emu.client.get("/health", timeout=1.0).status_code
        except httpx.ConnectError:
            state = "refused"
        else:
            state = str(status)
            if status == 503 and not generate_ok_while_starting:
                assert emu.client.get("/model_info").status_code == 200
                r = emu.client.post("/generate", json={"input_ids": [1, 2], "sampling_params": {}})
                generate_ok_while_starting = r.status_code == 200
        if not seen or seen[-1] != state:
            seen.append(state)
        if state == "200":
            break
        time.sleep(0.05)
    assert seen[0] == "refused" and seen[-1] == "200" and "503" in seen, seen
    assert seen.index("refused") < seen.index("503") < seen.index("200"), seen
    assert generate_ok_while_starting
    out = emu.stdout
    assert "Loading safetensors checkpoint shards:" in out and "64/64" in out
    assert out.index("64/64") < out.index("The server is fired up and ready to roll!")
    assert emu.stop() == 0


def test_die_during_startup(emu_factory: EmulatorFactory) -> None:
    message = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB."
    plain = emu_factory.start(
        "--emu-startup-refuse-s", "0.4", "--emu-die-during-startup", message, wait=False
    )
    assert plain.proc.wait(15) == 1  # --emu-die-exit-code picks another code
    assert message in plain.stderr and "Traceback (most recent call last):" in plain.stderr
    assert "fired up" not in plain.stdout
    try:
        httpx.get(f"{plain.url}/health", timeout=1.0)
        raise AssertionError("a dead emulator must not listen")
    except httpx.ConnectError:
        pass


def test_api_key(emu_factory: EmulatorFactory) -> None:
    key = "s3cret-key-value"
    emu = emu_factory.start("--api-key", key, "--tp", "8", "--reasoning-parser", "kimi_k2")
    body = {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 2}}
    assert emu.client.get("/health").status_code == 200
    assert emu.client.get("/health_generate").status_code == 200
    r = emu.client.post("/generate", json=body)
    assert r.status_code == 401 and r.json() == {"error": "Unauthorized"}
    wrong = emu.client.post("/generate", json=body, headers={"Authorization": "Bearer nope"})
    assert wrong.status_code == 401
    auth = {"Authorization": f"Bearer {key}"}
    assert emu.client.post("/generate", json=body, headers=auth).status_code == 200
    assert emu.client.get("/server_info").status_code == 401
    info = emu.client.get("/server_info", headers=auth)
    assert info.status_code == 200
    assert info.json()["api_key"] == key  # plaintext, as SGLang 0.5.23 reports it
    assert info.json()["tp_size"] == 8
    assert info.json()["reasoning_parser"] == "kimi_k2"
    assert emu.client.get("/model_info", headers=auth).json()["reasoning_parser"] == "kimi_k2"
    emu.stop()
    assert key not in emu.stdout and key not in emu.stderr


def test_server_info_reports_flat_args(emu: EmulatorProcess) -> None:
    info = emu.client.get("/server_info").json()
    assert info["reasoning_parser"] is None and info["tool_call_parser"] is None
    assert info["tp_size"] == 1 and info["dp_size"] == 1
    assert info["context_length"] == 8192
    assert info["model_path"] == str(TOKENIZER_DIR)
    assert info["version"] == "0.5.23" and info["emulator"] is True
    assert info["max_req_input_len"] == 8192 - 1 - 5
    assert isinstance(info["internal_states"], list) and len(info["internal_states"]) == 1
    assert "launch_command" in info and info["max_total_num_tokens"] > 0


def test_launch_flags_accepted(emu_factory: EmulatorFactory) -> None:
    emu = emu_factory.start(
        "--tp-size",
        "8",
        "--dp-size",
        "2",
        "--mem-fraction-static",
        "0.88",
        "--enable-hierarchical-cache",
        "--hicache-size",
        "48",
        "--hicache-ratio",
        "2.5",
        "--num-continuous-decode-steps",
        "4",
        "--trust-remote-code",
        "--host",
        "127.0.0.1",
        "--max-running-requests",
        "256",
        "--chunked-prefill-size",
        "8192",
        "--random-seed",
        "1",
        "--skip-server-warmup",
        "--log-level",
        "warning",
        "--served-model-name",
        "kimi",
        "--max-queued-requests",
        "1000",
        "--tool-call-parser",
        "kimi_k2",
        "--enable-metrics",
        "--stream-interval",
        "4",
        "--api-key",
        "k-s3cret",
        # SGLang flags the emulator does not model, and SGLang's abbreviations (allow_abbrev)
        "--enable-deterministic-inference",
        "--context-len",
        "8192",
    )
    auth = {"Authorization": "Bearer k-s3cret"}
    info = emu.client.get("/server_info", headers=auth).json()
    assert info["tp_size"] == 8 and info["dp_size"] == 2
    assert info["mem_fraction_static"] == 0.88 and info["enable_hierarchical_cache"] is True
    assert info["hicache_size"] == 48 and info["hicache_ratio"] == 2.5
    assert info["num_continuous_decode_steps"] == 4 and info["trust_remote_code"] is True
    assert info["served_model_name"] == "kimi" and info["max_running_requests"] == 256
    assert info["enable_deterministic_inference"] is True and info["context_length"] == 8192
    assert len(info["internal_states"]) == 2
    # As SGLang 0.5.23 reports them: the key in plaintext, the argv joined by spaces.
    assert info["api_key"] == "k-s3cret" and info["random_seed"] == 1
    assert info["launch_command"].startswith("--model-path ")
    assert info["launch_command"].endswith(
        "--api-key k-s3cret --enable-deterministic-inference --context-len 8192"
    )
    models = emu.client.get("/v1/models", headers=auth).json()
    assert models["object"] == "list" and models["data"][0]["id"] == "kimi"
    emu.generate({"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 3}}, headers=auth)
    assert emu.stop() == 0  # SIGTERM is a clean exit
    assert "s3cret" not in emu.stdout + emu.stderr  # the emulator's own log redacts


@pytest.mark.parametrize(
    ("flags", "error"),
    [
        (["--no-such-flag", "1"], "error: unrecognized arguments: --no-such-flag 1"),
        (["--enable-something-new"], "error: unrecognized arguments: --enable-something-new"),
        (["--max", "2"], "error: ambiguous option: --max could match"),
    ],
)
def test_unknown_or_ambiguous_flag_exits_2(flags: list[str], error: str) -> None:
    """SGLang's argparse exits 2 on these; a launcher must see the same from the emulator."""
    done = subprocess.run(
        [sys.executable, "-m", "sglang_emulator", "--model-path", str(TOKENIZER_DIR), *flags],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert error in done.stderr


def test_random_seed_drawn_per_launch(emu_factory: EmulatorFactory) -> None:
    """Without --random-seed, SGLang draws one per launch and /server_info reports it."""
    a, b = emu_factory.start_many([], [])
    seeds = [e.client.get("/server_info").json()["random_seed"] for e in (a, b)]
    assert all(isinstance(s, int) for s in seeds) and seeds[0] != seeds[1]
    info = a.client.get("/server_info").json()
    assert info["api_key"] is None and "emu_ledger" not in info


def test_model_info(emu: EmulatorProcess) -> None:
    info = emu.client.get("/model_info").json()
    assert info["is_generation"] is True and info["weight_version"] == "default"
    assert info["preferred_sampling_params"] is None
    assert info["model_type"] == "kimi_k25"
    assert info["architectures"] == ["KimiK25ForConditionalGeneration"]
    assert info["reasoning_parser"] is None
    # what the pipeline never calls is not served
    for path in ("/get_model_info", "/flush_cache", "/metrics", "/ready"):
        assert emu.client.get(path).status_code == 404, path
