"""Attaching to a server: a refused connection is not a server that is starting."""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from eagle3_datagen.config import parse_config
from eagle3_datagen.errors import ServerStartupError
from eagle3_datagen.sglang.health import wait_until_healthy
from eagle3_datagen.sglang.session import open_server
from tests.support import free_port, wait_until
from tests.support.emulator import EmulatorProcess
from tests.support.pipeline import base_config


def _listens(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except OSError:
        return False
    return True


class Lines:
    """A LogSink that keeps what the gate logs."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def _add(self, msg: object, *args: object) -> None:
        self.lines.append(str(msg) % args if args else str(msg))

    debug = info = warning = _add


async def test_nothing_listening_fails_in_seconds_not_at_the_deadline() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    started = time.monotonic()
    with pytest.raises(ServerStartupError) as info:
        await wait_until_healthy(url, deadline_s=3600, refused_limit_s=2)
    assert time.monotonic() - started < 10
    assert str(info.value).startswith(f"nothing listens at {url} (connection refused for 2 s)")


async def test_an_unknown_host_fails_in_seconds() -> None:
    with pytest.raises(ServerStartupError, match=r"cannot resolve host 'no-such-host\.invalid'"):
        await wait_until_healthy(
            "http://no-such-host.invalid:8000", deadline_s=3600, refused_limit_s=1
        )


async def test_a_warming_server_answering_503_is_waited_for(
    emulator_factory: Callable[..., EmulatorProcess],
) -> None:
    """SGLang listens with /health 503 while it warms up: that is starting, so the gate waits
    past the refused limit, and logs the status without a server log it does not have."""
    emu = emulator_factory("--emu-startup-503-s", "6")
    wait_until(lambda: _listens(emu.port), timeout_s=30)  # the emulator's own start-up
    log = Lines()
    waited = await wait_until_healthy(
        emu.url, deadline_s=60, refused_limit_s=1, progress_every_s=0.5, logger=log
    )
    assert waited > 2
    waiting = [line for line in log.lines if line.startswith("waiting for server")]
    assert waiting and all(line.endswith("/health_generate 503") for line in waiting), waiting


async def test_a_short_refusal_under_the_limit_is_waited_for(
    emulator_factory: Callable[..., EmulatorProcess],
) -> None:
    emu = emulator_factory("--emu-startup-refuse-s", "2")
    assert await wait_until_healthy(emu.url, deadline_s=60, refused_limit_s=8) > 1


async def test_run_attached_to_a_dead_port_fails_in_seconds(tmp_path: Path) -> None:
    """The run's own server session (attach mode, shipped 3600 s start-up timeout)."""
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("{}\n")
    url = f"http://127.0.0.1:{free_port()}"
    cfg = parse_config(
        base_config(tmp_path, prompts, mode="attach", url=url, startup_timeout_s=3600)
    )
    started = time.monotonic()
    with pytest.raises(ServerStartupError, match=f"nothing listens at {url}"):
        async with open_server(cfg, run_key="r", logger=logging.getLogger("t")):
            pass
    assert time.monotonic() - started < 30
