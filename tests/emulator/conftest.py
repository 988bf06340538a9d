"""Emulator test fixtures: real emulator processes on free ports, spoken to over real HTTP."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support import TOKENIZER_DIR
from tests.support.emulator import EmulatorFactory, EmulatorProcess
from tests.support.prompts import render


@pytest.fixture
def emu_factory(tmp_path: Path) -> Iterator[EmulatorFactory]:
    factory = EmulatorFactory(tmp_path)
    yield factory
    factory.stop_all()


@pytest.fixture(scope="session")
def ledger_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("ledger") / "ledger.jsonl"


@pytest.fixture(scope="session")
def emu(tmp_path_factory: pytest.TempPathFactory, ledger_path: Path) -> Iterator[EmulatorProcess]:
    """The shared default emulator (context 8192 so length limits are cheap to hit)."""
    factory = EmulatorFactory(tmp_path_factory.mktemp("emu"))
    # A fixed seed: without one the emulator, like SGLang, draws one per launch.
    yield factory.start(
        "--context-length", "8192", "--random-seed", "0", "--emu-ledger", str(ledger_path)
    )
    factory.stop_all()


@pytest.fixture(scope="session")
def hf_tokenizer() -> Any:
    """The bundled Kimi-style tokenizer through transformers, for its chat template."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(TOKENIZER_DIR))


@pytest.fixture(scope="session")
def special(hf_tokenizer: Any) -> dict[str, int]:
    """Special-token ids resolved by string, never hard-coded."""
    names = {
        "think": "<think>",
        "think_end": "</think>",
        "im_end": "<|im_end|>",
        "eos": "[EOS]",
        "im_middle": "<|im_middle|>",
        "sec_begin": "<|tool_calls_section_begin|>",
        "sec_end": "<|tool_calls_section_end|>",
        "call_begin": "<|tool_call_begin|>",
        "arg_begin": "<|tool_call_argument_begin|>",
        "call_end": "<|tool_call_end|>",
    }
    return {k: int(hf_tokenizer.convert_tokens_to_ids(v)) for k, v in names.items()}


@pytest.fixture(scope="session")
def prompt(hf_tokenizer: Any) -> list[int]:
    """A thinking-on prompt (ends with ``<think>``)."""
    return render(hf_tokenizer, "What is the capital of France?")
