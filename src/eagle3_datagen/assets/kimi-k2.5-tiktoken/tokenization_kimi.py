"""A Kimi-K2.5-shaped tokenizer: tiktoken BPE ranks plus special tokens numbered after them.

Why this file exists: Kimi-K2.5 ships its tokenizer as *remote code* (``auto_map`` in
``tokenizer_config.json`` names ``tokenization_kimi.TikTokenTokenizer``, loaded with
``trust_remote_code=True``): a slow ``PreTrainedTokenizer`` over tiktoken, not a Rust
``tokenizers`` backend. This is our own tokenizer of that shape, so the pipeline, the emulator and
the benchmarks are exercised on the same class path as the real model, offline and in CI.

- ``tiktoken.model``: the BPE ranks, one ``<base64 token bytes> <rank>`` per line, ranks 0..N-1.
- ``added_tokens_decoder`` in ``tokenizer_config.json``: every special token with its id; ids
  sit above the ranks (in Kimi-K2.5, 163584 up) and need not follow them directly.
- Text is split by ``PAT_STR`` and each piece is BPE-encoded by tiktoken; special tokens in text
  are matched first by transformers' added-token trie, as with any ``PreTrainedTokenizer``.
- Token strings (``get_vocab``, ``convert_ids_to_tokens``) use GPT-2's byte-to-unicode map, so a
  token with a leading space reads ``Ġword`` as in byte-level BPE vocabularies.

Built by ``scripts/build_kimi_tiktoken_tokenizer.py``; this file is written by hand.
"""

from __future__ import annotations

import base64
import os
import shutil
from typing import Any

import tiktoken
from tokenizers import AddedToken
from transformers import PreTrainedTokenizer

VOCAB_FILES_NAMES = {"vocab_file": "tiktoken.model"}

# How text is cut before BPE: a run of CJK ideographs; a word (letters and marks, not Han) with
# one leading non-letter such as a space, and an English contraction; up to three digits;
# punctuation with its trailing newlines; newlines with the spaces before them; other spaces.
PAT_STR = "|".join(
    [
        r"[\p{Han}]+",
        r"[^\r\n\p{L}\p{N}]?[\p{L}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
        r"\p{N}{1,3}",
        r" ?[^\s\p{L}\p{N}]+[\r\n]*",
        r"\s*[\r\n]+",
        r"\s+(?!\S)",
        r"\s+",
    ]
)


def _byte_to_unicode() -> dict[int, str]:
    """GPT-2's reversible map from each byte to a printable character (space -> 'Ġ')."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1)]
    printable += range(ord("®"), ord("ÿ") + 1)
    mapping = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in mapping:
            mapping[b] = chr(256 + extra)
            extra += 1
    return mapping


def load_ranks(path: str) -> dict[bytes, int]:
    """The ranks file, read directly (tiktoken's loader caches local files by path in /tmp)."""
    ranks: dict[bytes, int] = {}
    with open(path, "rb") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                token_b64, rank = line.split()
                ranks[base64.b64decode(token_b64, validate=True)] = int(rank)
            except ValueError as err:
                raise ValueError(f"{path}:{lineno}: not '<base64> <rank>': {err}") from None
    if sorted(ranks.values()) != list(range(len(ranks))):
        raise ValueError(f"{path}: ranks are not 0..{len(ranks) - 1}, each once")
    return ranks


class TikTokenTokenizer(PreTrainedTokenizer):
    """Kimi-style: tiktoken BPE over ``tiktoken.model``, special tokens from the config."""

    vocab_files_names = VOCAB_FILES_NAMES
    model_input_names: list[str] = ["input_ids", "attention_mask"]  # noqa: RUF012 (base's type)

    def __init__(
        self,
        vocab_file: str,
        bos_token: str | AddedToken = "[BOS]",
        eos_token: str | AddedToken = "[EOS]",
        unk_token: str | AddedToken = "[UNK]",
        pad_token: str | AddedToken = "[PAD]",
        added_tokens_decoder: dict[int, AddedToken] | None = None,
        **kwargs: Any,
    ) -> None:
        self.vocab_file = vocab_file
        ranks = load_ranks(vocab_file)
        specials = {str(token): int(i) for i, token in (added_tokens_decoder or {}).items()}
        clash = sorted(i for i in specials.values() if i < len(ranks))
        if clash:
            raise ValueError(f"special token ids {clash[:5]} collide with BPE ranks")
        self._bpe = tiktoken.Encoding(
            name=os.path.basename(vocab_file),
            pat_str=PAT_STR,
            mergeable_ranks=ranks,
            special_tokens=specials,
        )
        self._id_to_bytes = {i: token for token, i in ranks.items()}
        self._id_to_bytes.update({i: text.encode() for text, i in specials.items()})
        byte_to_char = _byte_to_unicode()
        self._char_to_byte = {c: b for b, c in byte_to_char.items()}
        self._id_to_str = {
            i: "".join(byte_to_char[b] for b in token) for i, token in self._id_to_bytes.items()
        }
        self._id_to_str.update({i: text for text, i in specials.items()})
        self._str_to_id = {s: i for i, s in self._id_to_str.items()}
        super().__init__(
            bos_token=bos_token,
            eos_token=eos_token,
            unk_token=unk_token,
            pad_token=pad_token,
            added_tokens_decoder=added_tokens_decoder or {},
            **kwargs,
        )

    @property
    def vocab_size(self) -> int:
        """One past the largest id, as the model's embedding table counts it."""
        return int(self._bpe.n_vocab)

    def get_vocab(self) -> dict[str, int]:
        return dict(self._str_to_id)

    def _tokenize(self, text: str, **kwargs: Any) -> list[str]:
        # Special tokens were split off by the added-token trie; the rest is ordinary text.
        return [self._id_to_str[i] for i in self._bpe.encode_ordinary(text)]

    def _convert_token_to_id(self, token: str) -> int:
        if token in self._str_to_id:
            return self._str_to_id[token]
        return self._str_to_id[str(self.unk_token)]

    def _convert_id_to_token(self, index: int) -> str:
        if index in self._id_to_str:
            return self._id_to_str[index]
        return str(self.unk_token)

    def convert_tokens_to_string(self, tokens: list[str]) -> str:
        out = bytearray()
        for token in tokens:
            if token in self._added_tokens_encoder:
                out += token.encode()
            else:
                out += bytes(self._char_to_byte[c] for c in token)
        return out.decode("utf-8", "replace")

    def _decode(
        self,
        token_ids: int | list[int],
        skip_special_tokens: bool = False,
        clean_up_tokenization_spaces: bool | None = None,
        **kwargs: Any,
    ) -> str:
        """Bytes of each id joined, then UTF-8: what tiktoken's own decode does."""
        ids = [token_ids] if isinstance(token_ids, int) else [int(i) for i in token_ids]
        skip = set(self.all_special_ids) if skip_special_tokens else set()
        unknown = [i for i in ids if i not in self._id_to_bytes]
        if unknown:
            raise ValueError(f"token ids not in the vocabulary: {unknown[:5]}")
        return b"".join(self._id_to_bytes[i] for i in ids if i not in skip).decode(
            "utf-8", "replace"
        )

    def save_vocabulary(
        self, save_directory: str, filename_prefix: str | None = None
    ) -> tuple[str, ...]:
        name = (f"{filename_prefix}-" if filename_prefix else "") + VOCAB_FILES_NAMES["vocab_file"]
        target = os.path.join(save_directory, name)
        if os.path.abspath(target) != os.path.abspath(self.vocab_file):
            shutil.copyfile(self.vocab_file, target)
        return (target,)
