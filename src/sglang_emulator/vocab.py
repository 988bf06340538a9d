"""The emulated model's tokenizer and config, loaded without transformers so startup stays fast.

Special tokens are resolved by their strings; no id is hard-coded, so the emulator works with
any tokenizer that carries the Kimi-style tokens (and degrades gracefully when some are absent).
A tokenizer without ``tokenizer.json`` that names remote code in ``auto_map`` (Kimi-K2.5's
tiktoken one) is loaded through transformers, as SGLang does, only with ``--trust-remote-code``.
"""

from __future__ import annotations

import hashlib
import random
import re
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
from tokenizers import AddedToken, Tokenizer

from sglang_emulator.hf_tokenizer import TransformersTokenizer, needs_remote_code

# Token strings of the Kimi K2 / K2.5 chat format, keyed by the role they play in the fake model.
KIMI_SPECIAL_TOKENS: dict[str, str] = {
    "bos": "[BOS]",
    "eos": "[EOS]",
    "im_end": "<|im_end|>",
    "im_user": "<|im_user|>",
    "im_assistant": "<|im_assistant|>",
    "im_system": "<|im_system|>",
    "im_middle": "<|im_middle|>",
    "tool_calls_section_begin": "<|tool_calls_section_begin|>",
    "tool_calls_section_end": "<|tool_calls_section_end|>",
    "tool_call_begin": "<|tool_call_begin|>",
    "tool_call_argument_begin": "<|tool_call_argument_begin|>",
    "tool_call_end": "<|tool_call_end|>",
    "think": "<think>",
    "think_end": "</think>",
}

# Config keys SGLang consults (in this order) for the context length.
_CONTEXT_KEYS = (
    "max_position_embeddings",
    "max_sequence_length",
    "seq_length",
    "n_positions",
)
_DEFAULT_CONTEXT_LENGTH = 131072

# Vocabulary entries that read as words once decoded: byte-level BPE marks a leading space with
# "Ġ", SentencePiece with "▁". Sampling from these keeps fake text looking like text.
_WORD_RE = re.compile(r"^[Ġ▁][a-z]{2,10}$")
_PUNCT_STRINGS = (".", ",", "Ġ.", "Ġ,", "?", ":", "Ġ-")


def pack_int32(ids: list[int]) -> bytes:
    """The ids as little-endian int32 bytes (two's complement for the rare negative id)."""
    return struct.pack(f"<{len(ids)}i", *ids)


def input_ids_sha256(ids: list[int]) -> str:
    """Hex sha256 of ``pack_int32(ids)``: the ledger's prompt fingerprint."""
    return hashlib.sha256(pack_int32(ids)).hexdigest()


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    data = orjson.loads(path.read_bytes())
    return data if isinstance(data, dict) else {}


def _token_content(value: Any) -> str | None:
    """tokenizer_config.json stores a token as a string or as an AddedToken dict."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return str(value["content"])
    return None


def _as_int_list(value: Any) -> list[int]:
    if isinstance(value, bool):
        return []
    if isinstance(value, int):
        return [value]
    if isinstance(value, list):
        return [v for v in value if isinstance(v, int) and not isinstance(v, bool)]
    return []


@dataclass(frozen=True)
class ModelMeta:
    """What /model_info and /server_info report about the checkpoint."""

    model_type: str | None
    architectures: list[str] | None
    context_length: int
    vocab_size: int


class Vocab:
    """Tokenizer plus the ids the fake model needs, resolved once at startup."""

    def __init__(
        self,
        model_path: Path,
        tokenizer_path: Path | None = None,
        *,
        trust_remote_code: bool = False,
    ) -> None:
        tok_dir = tokenizer_path or model_path
        tok_file = tok_dir / "tokenizer.json"
        tok_config = _read_json(tok_dir / "tokenizer_config.json")
        self.tokenizer: Tokenizer | TransformersTokenizer
        if needs_remote_code(tok_dir, tok_config):
            if not trust_remote_code:
                raise ValueError(
                    f"the tokenizer in {tok_dir} is remote code (auto_map in "
                    "tokenizer_config.json); pass --trust-remote-code to load it"
                )
            self.tokenizer = TransformersTokenizer(tok_dir, trust_remote_code=True)
        elif not tok_file.is_file():
            raise FileNotFoundError(f"no tokenizer.json in {tok_dir}")
        else:
            self.tokenizer = Tokenizer.from_file(str(tok_file))
            self._add_missing_tokens(tok_config)

        config = _read_json(model_path / "config.json") or _read_json(tok_dir / "config.json")
        text_config = config.get("text_config")
        text_config = text_config if isinstance(text_config, dict) else {}
        gen_config = _read_json(model_path / "generation_config.json") or _read_json(
            tok_dir / "generation_config.json"
        )

        self.special: dict[str, int] = {}
        for role, content in KIMI_SPECIAL_TOKENS.items():
            tid = self.tokenizer.token_to_id(content)
            if tid is not None:
                self.special[role] = tid

        # SGLang stops on config eos ∪ generation_config eos ∪ tokenizer.eos_token_id.
        eos: set[int] = set()
        for cfg in (config, text_config, gen_config):
            eos.update(_as_int_list(cfg.get("eos_token_id")))
        eos_str = _token_content(tok_config.get("eos_token"))
        if eos_str is not None:
            eos_id = self.tokenizer.token_to_id(eos_str)
            if eos_id is not None:
                eos.add(eos_id)
        self.eos_ids: frozenset[int] = frozenset(eos)

        self.added_ids: frozenset[int] = frozenset(
            int(i) for i in self.tokenizer.get_added_tokens_decoder()
        )
        tok_vocab_size = self.tokenizer.get_vocab_size(with_added_tokens=True)
        cfg_vocab = config.get("vocab_size") or text_config.get("vocab_size")
        vocab_size = max(tok_vocab_size, cfg_vocab if isinstance(cfg_vocab, int) else 0)

        context = _DEFAULT_CONTEXT_LENGTH
        for key in _CONTEXT_KEYS:
            value = text_config.get(key, config.get(key))
            if isinstance(value, int) and value > 0:
                context = value
                break
        archs = config.get("architectures")
        self.meta = ModelMeta(
            model_type=config.get("model_type")
            if isinstance(config.get("model_type"), str)
            else None,
            architectures=[str(a) for a in archs] if isinstance(archs, list) else None,
            context_length=context,
            vocab_size=vocab_size,
        )
        self.word_pool: list[int] = self._build_word_pool()
        self._tables = self._build_byte_tables()

    def _add_missing_tokens(self, tok_config: dict[str, Any]) -> None:
        """Register added tokens that tokenizer_config.json lists but tokenizer.json lacks."""
        decoder = tok_config.get("added_tokens_decoder")
        if not isinstance(decoder, dict) or not isinstance(self.tokenizer, Tokenizer):
            return
        missing = []
        for entry in decoder.values():
            content = _token_content(entry)
            if content is not None and self.tokenizer.token_to_id(content) is None:
                special = bool(entry.get("special", True)) if isinstance(entry, dict) else True
                missing.append(AddedToken(content, special=special, normalized=False))
        if missing:
            self.tokenizer.add_special_tokens(missing)

    def _build_word_pool(self) -> list[int]:
        """Ids the fake model samples ordinary text from: word-like tokens plus some punctuation."""
        vocab = self.tokenizer.get_vocab(with_added_tokens=False)
        words = sorted(i for s, i in vocab.items() if _WORD_RE.match(s) and i not in self.added_ids)
        punct = sorted(vocab[s] for s in _PUNCT_STRINGS if s in vocab)
        if len(words) < 50:
            # Not a tokenizer we recognise: fall back to every non-special id.
            return sorted(i for i in vocab.values() if i not in self.added_ids)
        # About one punctuation token per dozen words.
        if punct:
            repeat = max(1, len(words) // (12 * len(punct)))
            words.extend(punct * repeat)
        return words

    def _build_byte_tables(self) -> tuple[list[bytes], list[bytes]] | None:
        """Per-id bytes for byte-level BPE, so decoding is a join instead of a Rust call.

        Returns (with specials, without specials), or None when the tokenizer is not plain
        byte-level or the tables disagree with ``Tokenizer.decode`` on a sample.
        """
        if not isinstance(self.tokenizer, Tokenizer):
            return None  # remote code decodes its own way (tiktoken: bytes per id, in Rust)
        decoder = orjson.loads(self.tokenizer.to_str()).get("decoder") or {}
        if decoder.get("type") != "ByteLevel":
            return None
        char_to_byte = {c: b for b, c in _bytes_to_unicode().items()}
        vocab = self.tokenizer.get_vocab(with_added_tokens=True)
        size = max(vocab.values()) + 1
        plain = [b""] * size
        skip = [b""] * size
        added = self.tokenizer.get_added_tokens_decoder()
        for token, i in vocab.items():
            if i in added:
                plain[i] = token.encode()
                skip[i] = b"" if added[i].special else plain[i]
                continue
            try:
                plain[i] = skip[i] = bytes(char_to_byte[c] for c in token)
            except KeyError:
                return None
        rng = random.Random(0)
        ids = sorted(vocab.values())
        for _ in range(64):
            sample = rng.choices(ids, k=48)
            for table, flag in ((plain, False), (skip, True)):
                fast = b"".join([table[i] for i in sample]).decode("utf-8", "replace")
                if fast != self.tokenizer.decode(sample, skip_special_tokens=flag):
                    return None
        return plain, skip

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=add_special_tokens).ids)

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        """``Tokenizer.decode``, through the byte tables when they were verified at startup."""
        if self._tables is not None:
            table = self._tables[1] if skip_special_tokens else self._tables[0]
            try:
                return b"".join([table[i] for i in ids]).decode("utf-8", "replace")
            except IndexError:
                pass  # an id past the tokenizer's table: let the tokenizer handle it
        return str(self.tokenizer.decode(ids, skip_special_tokens=skip_special_tokens))


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte <-> printable-character map used by byte-level BPE vocabularies."""
    bs = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1)]
    bs += range(ord("®"), ord("ÿ") + 1)
    cs = list(bs)
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs, strict=True)}
