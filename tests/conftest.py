"""Shared fixtures: the bundled tokenizer, an emulator process, Prefect's real local backend."""

from __future__ import annotations

import atexit
import importlib.util
import os
import shutil
import signal
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support import TOKENIZER_DIR
from tests.support.emulator import EmulatorProcess


def _isolate_from_the_users_prefect() -> None:
    """The tests run on their own Prefect, whatever the user's shell has: the user's PREFECT_*
    settings (an API URL, a profile, a home) are dropped, and the session gets a home of its own,
    so neither ~/.prefect's profiles nor its database are read or written. Before any import of
    prefect, which reads its settings at import. Tests that start Prefect processes give them
    their own settings on top of this environment."""
    for name in [k for k in os.environ if k.startswith("PREFECT_")]:
        del os.environ[name]
    home = tempfile.mkdtemp(prefix="tests-prefect-home-")
    atexit.register(shutil.rmtree, home, ignore_errors=True)
    os.environ["PREFECT_HOME"] = home
    os.environ["PREFECT_SERVER_ANALYTICS_ENABLED"] = "false"


_isolate_from_the_users_prefect()
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


if importlib.util.find_spec("xdist") is not None:  # conformance/run.sh's environment has none

    @pytest.hookimpl(tryfirst=True)  # before xdist's own, which picks its --dist mode
    def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
        """Under ``pytest -n`` (pytest-xdist): every test module goes to one worker whole (its
        module fixtures set up once), and all of ``tests/e2e`` to one worker, in order: they
        share the session's real ``prefect server`` and its deployments (started once), and
        their timing assertions see the load of one other test at most. (``--dist loadgroup``
        with ``xdist_group`` marks would say the same, but pytest-xdist 3.8 sets a node id
        attribute pytest 9 no longer reads, so its groups are silently ignored.)"""
        from xdist.scheduler import LoadScopeScheduling

        class ModulesAndE2E(LoadScopeScheduling):
            def _split_scope(self, nodeid: str) -> str:
                if nodeid.startswith("tests/e2e/"):
                    return "tests/e2e"
                return nodeid.split("::", 1)[0]

        return ModulesAndE2E(config, log)
