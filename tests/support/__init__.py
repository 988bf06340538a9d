"""What tests and benchmarks share: the repository's paths, free ports, polling with a deadline.

Submodules: ``emulator`` (the emulator as a child process, its ledger), ``pipeline`` (prompt
files and pipeline configs), ``dataset`` (finished datasets written without a server),
``servers`` (launcher specs and cleanup by pid), ``prefect`` (a real ``prefect server``).
Benchmarks import it as ``tests.support`` (the repository root is on the path in a dev install).
"""

from __future__ import annotations

import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
TOKENIZER_DIR = REPO / "src" / "eagle3_datagen" / "assets" / "kimi-k2.5-mini"


def free_port() -> int:
    """A TCP port that was free a moment ago on 127.0.0.1."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_until(
    condition: Callable[[], object], timeout_s: float = 30.0, interval_s: float = 0.02
) -> None:
    """Poll ``condition`` until it is true; a loaded machine gets the whole ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"condition not met within {timeout_s}s: {condition!r}")
        time.sleep(interval_s)


def stop_process(proc: subprocess.Popen[Any], grace_s: float = 10.0) -> int:
    """SIGTERM a child we started, SIGKILL it after ``grace_s``; returns its exit status."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return int(proc.returncode)
