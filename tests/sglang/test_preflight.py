"""Pre-flight against a real emulator process: the run's own sampling, the retry policy, the API
key, and the warnings for settings that quietly undo a config promise."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from eagle3_datagen.config import ModelSpec, RetryPolicy, Sampling, ServerSpec
from eagle3_datagen.errors import PreflightError
from eagle3_datagen.sglang.client import GenerateRequest, SGLangClient
from eagle3_datagen.sglang.preflight import preflight, promise_warnings
from tests.support import TOKENIZER_DIR, wait_until
from tests.support.emulator import EmulatorProcess

pytestmark = pytest.mark.timeout(120)

Start = Callable[..., EmulatorProcess]
SERVER = ServerSpec(mode="attach", url="http://unused")
MODEL = ModelSpec(path=str(TOKENIZER_DIR))
QUICK = RetryPolicy(max_attempts=8, backoff_initial_s=0.2, backoff_max_s=1.0)


async def test_the_run_sampling_is_sent_and_a_refusal_fails_with_sglangs_reason(
    emulator_factory: Start,
) -> None:
    emu = emulator_factory().wait_ready()
    # A value the server refuses, built past the config's own check (which refuses it too).
    refused = Sampling.model_construct(**{**Sampling().model_dump(), "repetition_penalty": 0.0})
    async with SGLangClient(emu.url) as client:
        with pytest.raises(PreflightError, match=r"repetition_penalty must be in \(0, 2\]"):
            await preflight(client, server=SERVER, model=MODEL, sampling=refused, retries=QUICK)
        facts = await preflight(
            client, server=SERVER, model=MODEL, sampling=Sampling(temperature=0.6), retries=QUICK
        )
    assert facts.context_length > 0


async def test_a_busy_server_does_not_fail_preflight(emulator_factory: Start) -> None:
    # One decode slot, no queue: while another request holds the slot, /generate answers
    # 503 "The request queue is full." (another run on the same server).
    emu = emulator_factory(
        "--emu-running-slots",
        "1",
        "--max-queued-requests",
        "0",
        "--emu-decode-ms-per-token",
        "20",
        "--emu-mean-output-tokens",
        "100",
        "--emu-output-sigma",
        "0",
    ).wait_ready()
    async with SGLangClient(emu.url) as client:
        blocker = asyncio.create_task(
            client.generate(GenerateRequest([1, 2, 3], {"max_new_tokens": 100}, "other"))
        )
        await asyncio.to_thread(wait_until, lambda: emu.stats()["running"] == 1)
        emu.reset_stats()
        facts = await preflight(client, server=SERVER, model=MODEL, retries=QUICK)
        await blocker
    stats = emu.stats()
    assert stats["http_requests"] >= 2, "the smoke request was answered 503, then retried"
    assert facts.context_length > 0


async def test_a_wrong_api_key_fails_preflight_saying_so(emulator_factory: Start) -> None:
    emu = emulator_factory("--api-key", "right-key").wait_ready()
    async with SGLangClient(emu.url, api_key="wrong-key") as client:
        # /health* is open on SGLang: the health gate cannot see the key; pre-flight does.
        assert await client.health_status("/health_generate") == 200
        with pytest.raises(PreflightError, match=r"refused the configured API key.*api_key_env"):
            await preflight(client, server=SERVER, model=MODEL, api_key="wrong-key")
    async with SGLangClient(emu.url) as client:
        with pytest.raises(PreflightError, match="refused no API key"):
            await preflight(client, server=SERVER, model=MODEL)


async def test_a_seed_without_deterministic_inference_is_warned_about(
    emulator_factory: Start,
) -> None:
    emu = emulator_factory().wait_ready()
    async with SGLangClient(emu.url) as client:
        seeded = await preflight(client, server=SERVER, model=MODEL, sampling=Sampling(seed=7))
        plain = await preflight(client, server=SERVER, model=MODEL)
    assert any("--enable-deterministic-inference" in w for w in seeded.warnings)
    assert not any("deterministic" in w for w in plain.warnings)


def test_an_api_key_with_several_tokenizer_workers_is_warned_about() -> None:
    # SGLang installs its API-key middleware only with one tokenizer worker (http_server.py).
    info = {"tokenizer_worker_num": 2, "enable_deterministic_inference": True}
    warned = promise_warnings(info, sampling=Sampling(), api_key="k")
    assert len(warned) == 1 and "does not check the API key" in warned[0]
    assert promise_warnings(info, sampling=Sampling(), api_key=None) == []
    assert (
        promise_warnings({**info, "tokenizer_worker_num": 1}, sampling=Sampling(), api_key="k")
        == []
    )
    assert promise_warnings(info, sampling=Sampling(seed=1), api_key=None) == []


async def test_an_attached_servers_tp_size_is_compared_only_when_the_config_sets_it(
    emulator_factory: Start,
) -> None:
    """The emulator serves as one GPU (tp_size 1). Unset in the config, 8 is only what a
    launch would get: no warning; set, a different one is."""
    emu = emulator_factory().wait_ready()
    async with SGLangClient(emu.url) as client:
        unset = await preflight(client, server=SERVER, model=MODEL)
        eight = ServerSpec.model_validate(
            {"mode": "attach", "url": "http://unused", "launch": {"tp_size": 8}}
        )
        claimed = await preflight(client, server=eight, model=MODEL)
    assert not any("tp_size" in w for w in unset.warnings), unset.warnings
    assert "server tp_size is 1, the config says 8" in claimed.warnings, claimed.warnings
