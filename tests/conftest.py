"""Shared fixtures: the bundled tokenizer, an emulator process, Prefect's real local backend."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support import TOKENIZER_DIR
from tests.support.emulator import EmulatorProcess

os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

# A run started in the background by a non-interactive shell (`.ci/run > log &`) inherits SIGINT
# ignored, and every process the tests start would inherit that too. A Prefect worker answers
# SIGTERM with a SIGINT to itself; ignored, each worker stop sat out its 20 s grace and ended in
# a SIGKILL (CI: 20-50 s of teardown per test that starts workers). SIGINT's default back here
# (a handler, which exec resets to the default in children), as under a terminal.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(scope="session")
def tokenizer_dir() -> Path:
    return TOKENIZER_DIR


@pytest.fixture(scope="session")
def chat_tokenizer() -> Any:
    from eagle3_datagen.render.chat_tokenizer import ChatTokenizer

    return ChatTokenizer(str(TOKENIZER_DIR))


@pytest.fixture
def emulator_factory(tmp_path: Path) -> Iterator[Callable[..., EmulatorProcess]]:
    """Starts emulator processes (logs under ``tmp_path``) and stops them all at teardown."""
    started: list[EmulatorProcess] = []

    def start(*flags: str, ledger: Path | None = None, port: int | None = None) -> EmulatorProcess:
        emu = EmulatorProcess(*flags, ledger=ledger, log_dir=tmp_path, port=port)
        started.append(emu)
        return emu

    yield start
    for emu in started:
        emu.stop()


@pytest.fixture(scope="session")
def prefect_backend() -> Iterator[None]:
    """Prefect's real local backend (a temporary SQLite API server), once per test session."""
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=300):  # a loaded 2-core machine: ~140 s
        yield
