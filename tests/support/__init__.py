"""What tests and benchmarks share: the repository's paths, free ports, polling with a deadline,
waiting for a child server's ``/health``.

Submodules: ``emulator`` (the emulator as a child process, its ledger), ``pipeline`` (prompt
files and pipeline configs), ``dataset`` (finished datasets written without a server),
``servers`` (launcher specs and cleanup by pid), ``prefect`` (a real ``prefect server``),
``k8s_observer`` (pod watch events through prefect-kubernetes's observer handler).
Benchmarks import it as ``tests.support`` (the repository root is on the path in a dev install).
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import httpx

from eagle3_datagen.processes import free_port as free_port  # the one free_port

REPO = Path(__file__).resolve().parents[2]
TOKENIZER_DIR = REPO / "src" / "eagle3_datagen" / "assets" / "kimi-k2.5-mini"


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
    return stop_processes([proc], grace_s)[0]


def stop_processes(procs: Sequence[subprocess.Popen[Any]], grace_s: float = 10.0) -> list[int]:
    """SIGTERM every child at once, SIGKILL those still running ``grace_s`` later; their exit
    statuses. Stopping several costs the slowest one's time, not the sum of them."""
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
    deadline = time.monotonic() + grace_s
    for proc in procs:
        try:
            proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return [int(proc.returncode) for proc in procs]


def wait_healthy(
    proc: subprocess.Popen[Any],
    url: str,
    *,
    what: str,
    output: Callable[[], str],
    timeout_s: float,
    request_timeout_s: float = 1.0,
    interval_s: float = 0.05,
) -> bool:
    """Poll ``url``/health until it answers 200 (True) or ``timeout_s`` passes (False; the
    caller stops its child). A child that exits first fails with ``output()``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}: {output()}")
        try:
            if httpx.get(f"{url}/health", timeout=request_timeout_s).status_code == 200:
                return True
        except httpx.TransportError:
            pass
        time.sleep(interval_s)
    return False


def health_codes(
    url: str, *, timeout_s: float, request_timeout_s: float, interval_s: float = 0.2
) -> list[int]:
    """The status codes ``url``/health answers in turn, each change once, until 200 or
    ``timeout_s`` (0: no connection): what a server shows while it starts."""
    seen: list[int] = []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and 200 not in seen:
        try:
            code = httpx.get(f"{url}/health", timeout=request_timeout_s).status_code
        except httpx.TransportError:
            code = 0
        if not seen or seen[-1] != code:
            seen.append(code)
        time.sleep(interval_s)
    return seen
