"""The round-robin front of the router tests and benchmark (e) (``tests/support/front.py``):
a request whose client went away is cancelled on the server too, as when the client talks to
SGLang directly (SGLang aborts a request whose client disconnects). The front before this test
kept all 20 running after the client cancelled them (aiohttp >= 3.9 does not cancel a handler
whose client left unless asked), so benchmark (e)'s servers generated for cancelled runs."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path

import httpx

from eagle3_datagen.sglang.client import GenerateRequest, SGLangClient
from tests.support.emulator import EmulatorProcess
from tests.support.front import FrontProcess

LONG = {"max_new_tokens": 2000, "ignore_eos": True}


def _running(emu: EmulatorProcess) -> int:
    running: int = httpx.get(f"{emu.url}/emulator/stats", timeout=10).json()["running"]
    return running


def test_a_cancelled_client_request_is_cancelled_on_the_server(
    emulator_factory: Callable[..., EmulatorProcess], tmp_path: Path
) -> None:
    emu = emulator_factory("--emu-decode-ms-per-token", "20").wait_ready()

    async def go(url: str) -> int:
        async with SGLangClient(url) as client:
            tasks = [
                asyncio.create_task(client.generate(GenerateRequest([100 + i] * 50, LONG, f"r{i}")))
                for i in range(20)
            ]
            deadline = time.monotonic() + 20
            while _running(emu) < 20 and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
            started = _running(emu)
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        return started

    with FrontProcess([emu.url], tmp_path / "front.log") as front:
        assert asyncio.run(go(front.url)) == 20
        deadline = time.monotonic() + 5  # 2000 tokens x 20 ms = 40 s if nothing cancels them
        while _running(emu) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _running(emu) == 0
