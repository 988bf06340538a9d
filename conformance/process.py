"""The real SGLang app (`python -m conformance.server`) as a child process, for tests and
`conformance/record.py`: a free port, a Kimi-K2.5-layout model dir, its JSONL answer log."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Self

from conformance.model_dir import make_model_dir
from tests.support import free_port, wait_healthy

REPO = Path(__file__).resolve().parents[1]
ASSETS = REPO / "src" / "eagle3_datagen" / "assets"


def model_dir(work: Path, asset: str = "kimi-k2.5-mini") -> Path:
    """The bundled asset copied into `work` with its config in Kimi-K2.5's layout."""
    dest = work / f"model-{asset}"
    if not (dest / "config.json").exists():
        make_model_dir(ASSETS / asset, dest)
    return dest


class RealAppProcess:
    """SGLang 0.5.23's HTTP app with the fake engine, on `port` (a free one by default).

    `flags` are `sglang serve` flags plus `--fake-*` flags; `--model-path`, `--host` and
    `--port` are added. The answer log is `work/fake-<port>.jsonl` unless `log` is given, so a
    restarted server can keep appending to the same log.
    """

    def __init__(
        self,
        work: Path,
        *flags: str,
        model_path: Path | None = None,
        port: int | None = None,
        log: Path | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.model_path = model_path or model_dir(work)
        self.log = log or work / f"fake-{self.port}.jsonl"
        self.out_path = work / f"real-app-{self.port}-{time.monotonic_ns()}.log"
        self.argv = [
            "--model-path",
            str(self.model_path),
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            *flags,
        ]
        cmd = [sys.executable, "-m", "conformance.server", *self.argv, "--fake-log", str(self.log)]
        with self.out_path.open("wb") as out:
            self.proc = subprocess.Popen(
                cmd,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=REPO,
                env={**os.environ, **(env or {})},
                start_new_session=True,
            )

    @property
    def output(self) -> str:
        return self.out_path.read_text(errors="replace")

    def wait_ready(self, timeout_s: float = 120.0) -> Self:
        """Until `/health` answers 200 (after SGLang's own warm-up request)."""
        if wait_healthy(
            self.proc,
            self.url,
            what="real app",
            output=lambda: self.output[-3000:],
            timeout_s=timeout_s,
            request_timeout_s=25.0,
            interval_s=0.2,
        ):
            return self
        self.stop()
        raise TimeoutError(f"real app at {self.url} not healthy after {timeout_s}s")

    def answers(self) -> list[dict[str, Any]]:
        """The fake engine's log: one entry per finished request (complete lines only)."""
        data = self.log.read_bytes() if self.log.exists() else b""
        return [json.loads(line) for line in data.split(b"\n")[:-1] if line]

    def stop(self) -> int | None:
        """SIGTERM to its process group, SIGKILL after 15 s."""
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)
            except ProcessLookupError:
                pass
        return self.proc.returncode

    def __enter__(self) -> Self:
        return self.wait_ready()

    def __exit__(self, *exc: object) -> None:
        self.stop()
