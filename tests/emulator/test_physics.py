"""--emu-physics: a loaded server decodes each request slower but makes more tokens in all; a
full KV pool retracts requests (meta_info.num_retractions, SGLang's /metrics counter)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import aiohttp
import orjson

from benchmarks.emulator_ceiling import make_prompt
from sglang_emulator.vocab import Vocab
from tests.support import TOKENIZER_DIR, wait_until
from tests.support.emulator import KV_POOR_RETRACTING, EmulatorFactory


async def _send(url: str, bodies: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], float]:
    """All bodies at once; (responses, wall seconds)."""
    async with aiohttp.ClientSession() as s:

        async def one(body: dict[str, Any]) -> dict[str, Any]:
            async with s.post(f"{url}/generate", data=orjson.dumps(body)) as r:
                assert r.status == 200, await r.text()
                data: dict[str, Any] = orjson.loads(await r.read())
                return data

        t0 = time.monotonic()
        out = await asyncio.gather(*(one(b) for b in bodies))
        return list(out), time.monotonic() - t0


def _metric(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} not in /metrics")


def test_more_running_requests_make_slower_steps_and_more_tokens(
    emu_factory: EmulatorFactory,
) -> None:
    # The wall clock carries the physics' step times scaled by 0.2: large enough that they, not
    # the emulator's own CPU per request, decide the ratios on a loaded machine (at 0.05, with
    # two other jobs on the 2 cores, 64 requests' HTTP and JSON took most of t64).
    emu = emu_factory.start("--emu-physics", "seed-node", "--emu-time-scale", "0.2")
    vocab = Vocab(TOKENIZER_DIR)
    sp = {"max_new_tokens": 200, "ignore_eos": True}
    alone, t1 = asyncio.run(
        _send(emu.url, [{"input_ids": make_prompt(vocab, 100, 0), "sampling_params": sp}])
    )
    bodies = [{"input_ids": make_prompt(vocab, 100, i), "sampling_params": sp} for i in range(64)]
    loaded, t64 = asyncio.run(_send(emu.url, bodies))
    assert all(len(r["output_ids"]) == 200 for r in alone + loaded)
    # Each request waits longer for its tokens when 64 share the steps ...
    assert t64 > 2 * t1, (t1, t64)
    # ... but the server makes far more tokens per second in all.
    assert (64 * 200 / t64) > 10 * (200 / t1), (t1, t64)


def test_full_kv_pool_retracts_and_reports_it(emu_factory: EmulatorFactory) -> None:
    emu = emu_factory.start(
        *KV_POOR_RETRACTING,
        "--enable-metrics",
    )
    vocab = Vocab(TOKENIZER_DIR)
    sp = {"max_new_tokens": 4000}
    bodies = [{"input_ids": make_prompt(vocab, 200, i), "sampling_params": sp} for i in range(20)]
    out, _ = asyncio.run(_send(emu.url, bodies))
    retractions = [r["meta_info"]["num_retractions"] for r in out]
    assert sum(retractions) > 0
    # A retracted request still finishes with all its tokens, as SGLang's does.
    assert all(r["meta_info"]["finish_reason"]["type"] in ("stop", "length") for r in out)
    metrics = emu.client.get("/metrics").text
    assert _metric(metrics, "sglang:num_retracted_requests_total") >= max(retractions)
    assert _metric(metrics, "sglang:num_running_reqs") == 0


def test_metrics_only_with_enable_metrics_and_v1_loads_always(
    emu_factory: EmulatorFactory,
) -> None:
    emu = emu_factory.start()
    assert emu.client.get("/metrics").status_code == 404
    loads = emu.client.get("/v1/loads").json()["loads"][0]
    assert loads["num_running_reqs"] == 0 and loads["num_waiting_reqs"] == 0


def test_output_length_follows_the_requests_max_new_tokens(emu_factory: EmulatorFactory) -> None:
    """--emu-output-by-max-new: one server serves tiers with different mean output lengths."""
    emu = emu_factory.start(
        "--emu-output-by-max-new",
        "1000:50,8000:2000",
        "--emu-mean-output-tokens",
        "400",
        "--emu-output-sigma",
        "0.3",
    )
    vocab = Vocab(TOKENIZER_DIR)

    def mean_len(max_new: int) -> float:
        sp = {"max_new_tokens": max_new}
        bodies = [
            {"input_ids": make_prompt(vocab, 50, i), "sampling_params": sp} for i in range(40)
        ]
        out, _ = asyncio.run(_send(emu.url, bodies))
        return sum(len(r["output_ids"]) for r in out) / len(out)

    short, long, other = mean_len(1000), mean_len(8000), mean_len(3000)
    assert 30 < short < 80, short
    assert 1500 < long < 2600, long
    assert 250 < other < 600, other


def _running(emu: Any) -> int:
    """Requests the emulator is running now (its ``/v1/loads``)."""
    return sum(int(x["num_running_reqs"]) for x in emu.client.get("/v1/loads").json()["loads"])


def test_idle_time_and_lost_lag_are_counted_apart(emu_factory: EmulatorFactory) -> None:
    """/emulator/stats splits wall time the server did no simulated work into idle (nothing
    sent to it) and lag lost (the emulator stalled behind its scaled clock), so a benchmark can
    tell a client's gaps from the emulator's own limit."""
    import os
    import signal
    import threading

    emu = emu_factory.start("--emu-physics", "seed-node", "--emu-time-scale", "0.05")
    vocab = Vocab(TOKENIZER_DIR)
    body = {
        "input_ids": make_prompt(vocab, 100, 0),
        "sampling_params": {"max_new_tokens": 100, "ignore_eos": True},
    }
    asyncio.run(_send(emu.url, [body]))
    s0 = emu.stats()["physics"]
    time.sleep(0.6)  # nothing sent: the server is idle
    asyncio.run(_send(emu.url, [body]))
    s1 = emu.stats()["physics"]
    assert s1["idle_s"] - s0["idle_s"] >= 0.5, (s0, s1)
    assert s1["lag_lost_s"] - s0["lag_lost_s"] < 0.25, (s0, s1)

    # A stall while decoding (the process stopped for 0.6 s) is lag lost, not idle time.
    def stall() -> None:
        wait_until(lambda: _running(emu) > 0, timeout_s=30, interval_s=0.01)  # decoding now
        os.kill(emu.proc.pid, signal.SIGSTOP)
        time.sleep(0.6)  # the stall itself
        os.kill(emu.proc.pid, signal.SIGCONT)

    stopper = threading.Thread(target=stall)
    stopper.start()
    long = {**body, "sampling_params": {"max_new_tokens": 1000, "ignore_eos": True}}
    asyncio.run(_send(emu.url, [long]))  # ~11 simulated s of decode: ~0.55 s at scale 0.05
    stopper.join()
    s2 = emu.stats()["physics"]
    assert s2["lag_lost_s"] - s1["lag_lost_s"] >= 0.4, (s1, s2)
    assert s2["idle_s"] - s1["idle_s"] < 0.1, (s1, s2)
