"""A tokenizer that ships as remote code, behind the part of ``tokenizers.Tokenizer`` Vocab uses.

Why: Kimi-K2.5's tokenizer has no ``tokenizer.json``; it is a Python ``PreTrainedTokenizer`` over
tiktoken, named by ``auto_map`` in ``tokenizer_config.json``. SGLang loads it with
``AutoTokenizer.from_pretrained(..., trust_remote_code=True)``, and so does the emulator when a
checkpoint has no ``tokenizer.json``. transformers is imported only then, so startup with a fast
tokenizer stays as quick as before.
"""

from __future__ import annotations

import logging
import os
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class _Encoding:
    ids: list[int]


class TransformersTokenizer:
    """``AutoTokenizer`` for ``tok_dir`` with ``token_to_id``, ``encode(...).ids``, ``decode``..."""

    def __init__(self, tok_dir: Path, *, trust_remote_code: bool) -> None:
        os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            logging.getLogger("transformers").setLevel(logging.ERROR)
            from transformers import AutoTokenizer

            self.tok: Any = AutoTokenizer.from_pretrained(
                str(tok_dir), trust_remote_code=trust_remote_code
            )
        self._vocab: dict[str, int] = dict(self.tok.get_vocab())
        self._vocab.update(self.tok.get_added_vocab())

    def token_to_id(self, token: str) -> int | None:
        return self._vocab.get(token)

    def get_vocab(self, with_added_tokens: bool = True) -> dict[str, int]:
        if with_added_tokens:
            return dict(self._vocab)
        added = self.tok.added_tokens_decoder
        return {s: i for s, i in self._vocab.items() if i not in added}

    def get_added_tokens_decoder(self) -> dict[int, Any]:
        return dict(self.tok.added_tokens_decoder)

    def get_vocab_size(self, with_added_tokens: bool = True) -> int:
        """One past the largest id (ids need not be dense: Kimi's specials sit above the ranks)."""
        return max(self.get_vocab(with_added_tokens).values(), default=-1) + 1

    def encode(self, text: str, add_special_tokens: bool = False) -> _Encoding:
        return _Encoding(list(self.tok.encode(text, add_special_tokens=add_special_tokens)))

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return str(self.tok.decode(ids, skip_special_tokens=skip_special_tokens))


def needs_remote_code(tok_dir: Path, tok_config: dict[str, Any]) -> bool:
    """No ``tokenizer.json`` but an ``auto_map`` for AutoTokenizer: a remote-code tokenizer."""
    auto_map = tok_config.get("auto_map")
    return (
        not (tok_dir / "tokenizer.json").is_file()
        and isinstance(auto_map, dict)
        and "AutoTokenizer" in auto_map
    )
