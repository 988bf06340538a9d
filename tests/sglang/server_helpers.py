"""Helpers for server-lifecycle tests: free ports, emulator specs, and process cleanup by pid."""

from __future__ import annotations

import os
import signal
import socket
import time
from pathlib import Path
from typing import Any

import eagle3_datagen
from eagle3_datagen.config import ModelSpec, ServerSpec
from eagle3_datagen.sglang.orphans import pid_alive
from eagle3_datagen.sglang.process import ServerProcess

MODEL_DIR = Path(eagle3_datagen.__file__).parent / "assets" / "kimi-k2.5-mini"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def emulator_spec(port: int, *extra: str, **kw: Any) -> ServerSpec:
    return ServerSpec(engine="emulator", port=port, extra_args=list(extra), **kw)


def model_spec() -> ModelSpec:
    return ModelSpec(path=str(MODEL_DIR))


def wait_gone(pid: int, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not pid_alive(pid):
            return True
        time.sleep(0.05)
    return not pid_alive(pid)


class Cleanup:
    """Stops every server and kills every pid a test registered, even when the test fails."""

    def __init__(self) -> None:
        self.servers: list[ServerProcess] = []
        self.pids: list[int] = []

    def server(self, sp: ServerProcess) -> ServerProcess:
        self.servers.append(sp)
        return sp

    def pid(self, pid: int) -> int:
        self.pids.append(pid)
        return pid

    def run(self) -> None:
        for sp in self.servers:
            sp.stop(grace_s=2.0)
        for pid in self.pids:
            if pid_alive(pid):
                try:
                    os.killpg(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
