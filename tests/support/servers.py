"""Server-lifecycle helpers: emulator launch specs, waiting for a pid to go, cleanup by pid."""

from __future__ import annotations

import os
import signal
import time
from typing import Any

from eagle3_datagen.config import ModelSpec, ServerSpec
from eagle3_datagen.processes import pid_alive
from eagle3_datagen.sglang.process import ServerProcess
from tests.support import TOKENIZER_DIR


def emulator_spec(port: int, *extra: str, **kw: Any) -> ServerSpec:
    return ServerSpec(engine="emulator", port=port, extra_args=list(extra), **kw)


def model_spec() -> ModelSpec:
    return ModelSpec(path=str(TOKENIZER_DIR))


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
