"""The demo's configuration: bundled tokenizer, bundled prompts, the emulator on a free port."""

from __future__ import annotations

import datetime as dt
from importlib.resources import files
from pathlib import Path

from eagle3_datagen.config import PipelineConfig, parse_config
from eagle3_datagen.processes import free_port

ASSETS = Path(str(files("eagle3_datagen") / "assets"))
# The bundled Kimi-K2.5-style tokenizers: a fast (Rust) one, and one on Kimi's own class path
# (remote code over tiktoken, special tokens at Kimi's ids; docs/emulator.md, "Test tokenizers").
TOKENIZERS = {"mini": ASSETS / "kimi-k2.5-mini", "tiktoken": ASSETS / "kimi-k2.5-tiktoken"}
TOKENIZER_DIR = TOKENIZERS["mini"]
DEMO_DIR = ASSETS / "demo"


def default_output_dir() -> Path:
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    return Path("datagen-output") / f"demo-{stamp}"


def demo_config(
    output_dir: str | Path, port: int | None = None, tokenizer: str = "mini"
) -> PipelineConfig:
    """Same settings as configs/demo.yaml (``tokenizer="tiktoken"``: configs/demo-tiktoken.yaml),
    with absolute paths and a free port."""
    output_dir = Path(output_dir).resolve()
    return parse_config(
        {
            "model": {"path": str(TOKENIZERS[tokenizer]), "trust_remote_code": True},
            "server": {
                "mode": "launch",
                "engine": "emulator",
                "port": port or free_port(),
                "limits": {"startup_timeout_s": 120, "request_timeout_s": 120},
                "extra_args": ["--emu-ledger", str(output_dir / "emulator-ledger.jsonl")],
            },
            "tiers": [
                {"name": "SHORT", "concurrency": 150, "max_tokens": 10240},
                {"name": "LONG", "concurrency": 32, "max_tokens": 16384},
            ],
            "partitions": [
                {"name": "demo_short", "input": str(DEMO_DIR / "short.jsonl"), "tier": "SHORT"},
                {"name": "demo_long", "input": str(DEMO_DIR / "long.jsonl"), "tier": "LONG"},
                # Kimi-K2.5 image prompts (scripts/make_demo_images.py; docs/images.md)
                {"name": "demo_images", "input": str(DEMO_DIR / "images.jsonl"), "tier": "SHORT"},
            ],
            "output_dir": str(output_dir),
            "batch_size": 16,
            "retries": {"max_attempts": 4, "backoff_initial_s": 0.5, "backoff_max_s": 5},
        },
        source="demo",
    )
