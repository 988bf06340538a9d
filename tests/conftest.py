"""Shared fixtures: the bundled tokenizer, an emulator process, Prefect's real local backend."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

REPO = Path(__file__).resolve().parents[1]
TOKENIZER_DIR = REPO / "src" / "eagle3_datagen" / "assets" / "kimi-k2.5-mini"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="session")
def tokenizer_dir() -> Path:
    return TOKENIZER_DIR


@pytest.fixture(scope="session")
def chat_tokenizer():  # type: ignore[no-untyped-def]
    from eagle3_datagen.render.chat_tokenizer import ChatTokenizer

    return ChatTokenizer(str(TOKENIZER_DIR))


class EmulatorProcess:
    """A real emulator process on a free port; stopped by its pid."""

    def __init__(self, *extra: str, ledger: Path | None = None) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cmd = [sys.executable, "-m", "sglang_emulator", "--model-path", str(TOKENIZER_DIR),
               "--port", str(self.port), "--host", "127.0.0.1", *extra]  # fmt: skip
        if ledger is not None:
            cmd += ["--emu-ledger", str(ledger)]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    def wait_ready(self, timeout: float = 30.0) -> EmulatorProcess:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"emulator exited: {self.proc.stderr.read().decode()}")  # type: ignore[union-attr]
            try:
                if httpx.get(f"{self.url}/health", timeout=1.0).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        raise TimeoutError("emulator did not become healthy")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture
def emulator_factory() -> Iterator[type[EmulatorProcess]]:
    started: list[EmulatorProcess] = []

    class Factory(EmulatorProcess):
        def __init__(self, *extra: str, ledger: Path | None = None) -> None:
            super().__init__(*extra, ledger=ledger)
            started.append(self)

    yield Factory
    for emu in started:
        emu.stop()


@pytest.fixture(scope="session")
def prefect_backend() -> Iterator[None]:
    """Prefect's real local backend (a temporary SQLite API server), once per test session."""
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        yield
