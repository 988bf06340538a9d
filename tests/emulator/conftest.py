"""Emulator test fixtures: real emulator processes on free ports, spoken to over real HTTP."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

import eagle3_datagen

ASSET_DIR = Path(eagle3_datagen.__file__).resolve().parent / "assets" / "kimi-k2.5-mini"
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"type": "string"}},
            "required": ["city"],
        },
    },
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Emu:
    """One ``python -m sglang_emulator`` process; its stdout/stderr go to files."""

    def __init__(self, logdir: Path, *args: str, model_path: Path = ASSET_DIR) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.out_path = logdir / f"emu-{self.port}.out"
        self.err_path = logdir / f"emu-{self.port}.err"
        cmd = [
            sys.executable, "-m", "sglang_emulator",
            "--model-path", str(model_path), "--port", str(self.port), *args,
        ]  # fmt: skip
        with self.out_path.open("wb") as out, self.err_path.open("wb") as err:
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=err)
        self.client = httpx.Client(base_url=self.url, timeout=10.0)

    @property
    def stdout(self) -> str:
        return self.out_path.read_text()

    @property
    def stderr(self) -> str:
        return self.err_path.read_text()

    def wait_ready(self, timeout: float = 20.0) -> Emu:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"emulator exited {self.proc.returncode}: {self.stderr}")
            try:
                if self.client.get("/health", timeout=1.0).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            time.sleep(0.05)
        raise TimeoutError(f"emulator not healthy after {timeout}s: {self.stderr}")

    def generate(self, body: dict[str, Any], **kw: Any) -> Any:
        """POST /generate expecting 200; returns the parsed JSON."""
        r = self.client.post("/generate", json=body, **kw)
        assert r.status_code == 200, r.text
        return r.json()

    def stop(self) -> int:
        self.client.close()
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


class EmuFactory:
    """Starts emulators (all at once, then waits) and stops them at teardown."""

    def __init__(self, logdir: Path) -> None:
        self.logdir = logdir
        self.started: list[Emu] = []

    def start(self, *args: str, wait: bool = True, **kw: Any) -> Emu:
        emu = Emu(self.logdir, *args, **kw)
        self.started.append(emu)
        return emu.wait_ready() if wait else emu

    def start_many(self, *arg_lists: list[str]) -> list[Emu]:
        emus = [self.start(*a, wait=False) for a in arg_lists]
        return [e.wait_ready() for e in emus]

    def stop_all(self) -> None:
        for emu in self.started:
            emu.stop()


@pytest.fixture
def emu_factory(tmp_path: Path) -> Iterator[EmuFactory]:
    factory = EmuFactory(tmp_path)
    yield factory
    factory.stop_all()


@pytest.fixture(scope="session")
def ledger_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("ledger") / "ledger.jsonl"


@pytest.fixture(scope="session")
def emu(tmp_path_factory: pytest.TempPathFactory, ledger_path: Path) -> Iterator[Emu]:
    """The shared default emulator (context 8192 so length limits are cheap to hit)."""
    factory = EmuFactory(tmp_path_factory.mktemp("emu"))
    yield factory.start("--context-length", "8192", "--emu-ledger", str(ledger_path))
    factory.stop_all()


@pytest.fixture(scope="session")
def hf_tokenizer() -> Any:
    """The bundled Kimi-style tokenizer through transformers, for its chat template."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(ASSET_DIR))


@pytest.fixture(scope="session")
def special(hf_tokenizer: Any) -> dict[str, int]:
    """Special-token ids resolved by string, never hard-coded."""
    names = {
        "think": "<think>", "think_end": "</think>", "im_end": "<|im_end|>", "eos": "[EOS]",
        "im_middle": "<|im_middle|>", "sec_begin": "<|tool_calls_section_begin|>",
        "sec_end": "<|tool_calls_section_end|>", "call_begin": "<|tool_call_begin|>",
        "arg_begin": "<|tool_call_argument_begin|>", "call_end": "<|tool_call_end|>",
    }  # fmt: skip
    return {k: int(hf_tokenizer.convert_tokens_to_ids(v)) for k, v in names.items()}


def render(tok: Any, text: str, tools: list[Any] | None = None, **kwargs: Any) -> list[int]:
    ids = tok.apply_chat_template(
        [{"role": "user", "content": text}],
        tools=tools,
        add_generation_prompt=True,
        tokenize=True,
        return_dict=False,
        **kwargs,
    )
    return [int(i) for i in ids]


@pytest.fixture(scope="session")
def prompt(hf_tokenizer: Any) -> list[int]:
    """A thinking-on prompt (ends with ``<think>``)."""
    return render(hf_tokenizer, "What is the capital of France?")
