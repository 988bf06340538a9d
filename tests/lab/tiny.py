"""The tests' tiny Llama: 4 layers, hidden 32, random weights; small enough to run anywhere,
a real transformers model all the same. Needs transformers (the trainer venv)."""

from __future__ import annotations

from typing import Any

import transformers


def tiny_llama_config(vocab_size: int, max_positions: int, **extra: Any) -> Any:
    return transformers.LlamaConfig(
        hidden_size=32,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=64,
        vocab_size=vocab_size,
        max_position_embeddings=max_positions,
        **extra,
    )
