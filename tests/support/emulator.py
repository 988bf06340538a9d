"""The bundled SGLang emulator as a child process: started on a free port, awaited on
``/health``, stopped by its own pid (SIGTERM, then SIGKILL); its output goes to files."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Self

import httpx
import orjson

from tests.support import TOKENIZER_DIR, free_port, stop_process, wait_healthy

# Emulator flags shared by tests. A KV-poor server that retracts within seconds: a 20,000-token
# pool and ~3,000-token answers (sglang_emulator/physics.py's kv-poor profile, time-scaled).
KV_POOR_RETRACTING = (
    "--emu-physics",
    "kv-poor",
    "--emu-time-scale",
    "0.001",
    "--emu-max-total-tokens",
    "20000",
    "--emu-mean-output-tokens",
    "3000",
    "--emu-output-sigma",
    "0.2",
)
# A seed-node server with its /metrics on and answers of about 300 tokens, for a controller's
# test. Each request lasts ~0.2 s of real time (300 steps x ~12 ms x 0.05): long enough that
# requests overlap and a reading sees them even when a loaded machine paces the client slowly
# (at 0.01 they lasted ~20 ms and a CI run's readings never saw more than 2 running).
SEED_NODE_WITH_METRICS = (
    "--emu-physics",
    "seed-node",
    "--emu-time-scale",
    "0.05",
    "--enable-metrics",
    "--emu-mean-output-tokens",
    "300",
    "--emu-output-sigma",
    "0.3",
)


class EmulatorProcess:
    """``python -m sglang_emulator`` on a free port; ``wait_ready()`` before use.

    stdout and stderr go to ``log_dir`` (a temporary directory, removed at ``stop()``, when
    none is given), so a chatty child can never block on a full pipe.
    """

    def __init__(
        self,
        *flags: str,
        ledger: Path | None = None,
        log_dir: Path | None = None,
        model_path: Path = TOKENIZER_DIR,
        port: int | None = None,
    ) -> None:
        self.port = port or free_port()  # a given port: a server restarted where it was
        self.url = f"http://127.0.0.1:{self.port}"
        self._tmp = None if log_dir is not None else tempfile.mkdtemp(prefix="emulator-")
        logs = log_dir if log_dir is not None else Path(self._tmp or ".")
        self.out_path = logs / f"emulator-{self.port}.out"
        self.err_path = logs / f"emulator-{self.port}.err"
        cmd = [
            sys.executable,
            "-m",
            "sglang_emulator",
            "--model-path",
            str(model_path),
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            *flags,
        ]
        if ledger is not None:
            cmd += ["--emu-ledger", str(ledger)]
        with self.out_path.open("wb") as out, self.err_path.open("wb") as err:
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=err)
        self._client: httpx.Client | None = None

    @property
    def client(self) -> httpx.Client:
        """A keep-alive client on this emulator (closed by ``stop()``)."""
        if self._client is None:
            self._client = httpx.Client(base_url=self.url, timeout=10.0)
        return self._client

    @property
    def stdout(self) -> str:
        return self.out_path.read_text()

    @property
    def stderr(self) -> str:
        return self.err_path.read_text()

    def wait_ready(self, timeout_s: float = 60.0) -> Self:
        """Block until ``/health`` answers 200; fail with the child's stderr if it exits."""
        if wait_healthy(
            self.proc,
            self.url,
            what="emulator",
            output=lambda: self.stderr[-2000:],
            timeout_s=timeout_s,
        ):
            return self
        self.stop()
        raise TimeoutError(f"emulator at {self.url} not healthy after {timeout_s}s")

    def generate(self, body: dict[str, Any], **kw: Any) -> Any:
        """POST /generate expecting 200; returns the parsed JSON."""
        r = self.client.post("/generate", json=body, **kw)
        assert r.status_code == 200, r.text
        return r.json()

    def stats(self) -> dict[str, Any]:
        data: dict[str, Any] = self.client.get("/emulator/stats").json()
        return data

    def reset_stats(self) -> None:
        self.client.post("/emulator/reset_stats").raise_for_status()

    def cpu_s(self) -> float:
        """The emulator's own CPU seconds, from /proc (Linux)."""
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self) -> int:
        """SIGTERM, SIGKILL after 10 s; returns the exit status."""
        if self._client is not None:
            self._client.close()
            self._client = None
        code = stop_process(self.proc)
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None
        return code

    def __enter__(self) -> Self:
        return self.wait_ready()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def read_ledger(path: Path) -> list[dict[str, Any]]:
    """The ledger's complete lines (the emulator may be writing the last one right now)."""
    data = path.read_bytes() if path.exists() else b""
    return [orjson.loads(line) for line in data.split(b"\n")[:-1] if line]


class EmulatorFactory:
    """Starts emulators (several at once, then waits for all) and stops them at teardown."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.started: list[EmulatorProcess] = []

    def start(self, *flags: str, wait: bool = True, **kw: Any) -> EmulatorProcess:
        emu = EmulatorProcess(*flags, log_dir=self.log_dir, **kw)
        self.started.append(emu)
        return emu.wait_ready() if wait else emu

    def start_many(self, *flag_lists: list[str]) -> list[EmulatorProcess]:
        emus = [self.start(*flags, wait=False) for flags in flag_lists]
        return [e.wait_ready() for e in emus]

    def stop_all(self) -> None:
        for emu in self.started:
            emu.stop()
