"""Build the tiktoken-based Kimi-K2.5-style tokenizer in ``assets/kimi-k2.5-tiktoken``.

Why: Kimi-K2.5's real tokenizer is not a fast (Rust) tokenizer. It is remote code
(``auto_map`` -> ``tokenization_kimi.TikTokenTokenizer``, loaded with ``trust_remote_code``), a
Python ``PreTrainedTokenizer`` over tiktoken with a ranks file (``tiktoken.model``) and special
tokens numbered after the BPE ranks. ``kimi-k2.5-mini`` is a fast tokenizer, so it cannot show
whether anything in the pipeline, the emulator or the benchmarks depends on a Rust backend; this
fixture takes the real model's class path. The files are committed; rerun only to change them:

    uv run python scripts/build_kimi_tiktoken_tokenizer.py

What is shared with ``kimi-k2.5-mini`` (``scripts/build_kimi_tokenizer.py``): the training text,
the special-token strings and the chat template, so the two fixtures render the same
conversations into prompts of similar length and differ only in the tokenizer class.

Special tokens sit at Kimi-K2.5's real ids, 163584 ([BOS]) to 163839 ([PAD]), with
``<think>``/``</think>`` at 163606/163607, although the BPE ranks end near 700. This leaves a
gap of unused ids, which the real model does not have, but it is what the fixture is for: ids
above 65535 catch any int16/uint16 storage or an id table sized by the vocabulary file rather
than by ``config.json``'s ``vocab_size`` (163840), in the Parquet columns, the validator and the
emulator, and the ids the tests see are the ones a GPU run will produce. Slots in the block that
Kimi does not name are ``<|reserved_token_<id>|>``.

The ranks come from the same byte-level BPE training as the mini tokenizer (``tokenizers``'
trainer, ranks in merge order); ``tokenization_kimi.py`` then cuts text with its own pattern,
which any complete set of byte-level ranks encodes.
"""

from __future__ import annotations

import base64
import shutil
import sys
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

sys.path.insert(0, str(Path(__file__).resolve().parent))
from build_kimi_tokenizer import (
    CHAT_TEMPLATE,
    CORPUS,
    SPECIAL_TOKENS,
    VOCAB_SIZE,
    added_tokens_decoder,
    write_json,
    write_model_files,
)

OUT_DIR = (
    Path(__file__).resolve().parents[1] / "src" / "eagle3_datagen" / "assets" / "kimi-k2.5-tiktoken"
)
FIRST_SPECIAL_ID = 163584  # Kimi-K2.5: [BOS]
VOCAB_END = 163840  # Kimi-K2.5's vocab_size: the special block is 163584..163839
# Role and turn tokens Kimi's tokenizer lists as additional special tokens (skipped by
# decode(skip_special_tokens=True)); <think> and the tool-call tokens are not among them.
ADDITIONAL_SPECIAL = [
    "<|im_end|>",
    "<|im_user|>",
    "<|im_assistant|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "[EOT]",
    "<|im_system|>",
    "<|im_middle|>",
]


def special_token_ids() -> dict[int, str]:
    """Kimi-K2.5's special block: the named tokens at their real ids, reserved names elsewhere."""
    named = [t for t in SPECIAL_TOKENS if t not in ("[UNK]", "[PAD]")]
    block = {FIRST_SPECIAL_ID + i: t for i, t in enumerate(named) if "reserved" not in t}
    block[VOCAB_END - 2] = "[UNK]"
    block[VOCAB_END - 1] = "[PAD]"
    return {i: block.get(i, f"<|reserved_token_{i}|>") for i in range(FIRST_SPECIAL_ID, VOCAB_END)}


def train_ranks() -> dict[bytes, int]:
    """Byte-level BPE trained on the mini tokenizer's corpus: token bytes -> rank (merge order)."""
    tokenizer = Tokenizer(models.BPE(unk_token=None, byte_fallback=False))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        min_frequency=1,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[],
    )
    tokenizer.train_from_iterator([CORPUS] * 4, trainer=trainer)
    char_to_byte = {c: b for b, c in _byte_to_unicode().items()}
    ranks = {
        bytes(char_to_byte[c] for c in token): i
        for token, i in tokenizer.get_vocab(with_added_tokens=False).items()
    }
    if sorted(ranks.values()) != list(range(len(ranks))) or len(ranks) < 256:
        raise AssertionError("trained vocabulary is not a dense set of byte-level ranks")
    return ranks


def _byte_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character map, as ``pre_tokenizers.ByteLevel`` uses it."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1)]
    printable += range(ord("®"), ord("ÿ") + 1)
    mapping = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in mapping:
            mapping[b] = chr(256 + extra)
            extra += 1
    return mapping


def build(out_dir: Path = OUT_DIR) -> None:
    """Write the data files; ``tokenization_kimi.py`` (hand-written) is copied when elsewhere."""
    ranks = train_ranks()
    specials = special_token_ids()
    ids = {t: i for i, t in specials.items()}
    out_dir.mkdir(parents=True, exist_ok=True)
    if out_dir.resolve() != OUT_DIR.resolve():
        shutil.copyfile(OUT_DIR / "tokenization_kimi.py", out_dir / "tokenization_kimi.py")
    lines = [
        f"{base64.b64encode(tok).decode()} {rank}"
        for tok, rank in sorted(ranks.items(), key=lambda kv: kv[1])
    ]
    (out_dir / "tiktoken.model").write_text("\n".join(lines) + "\n")
    config = {
        "tokenizer_class": "TikTokenTokenizer",
        "auto_map": {"AutoTokenizer": ["tokenization_kimi.TikTokenTokenizer", None]},
        "bos_token": "[BOS]",
        "eos_token": "[EOS]",
        "unk_token": "[UNK]",
        "pad_token": "[PAD]",
        "additional_special_tokens": ADDITIONAL_SPECIAL,
        "clean_up_tokenization_spaces": False,
        "model_max_length": 262144,
        "added_tokens_decoder": added_tokens_decoder(specials),
        "chat_template": CHAT_TEMPLATE,
    }
    write_json(out_dir / "tokenizer_config.json", config)
    comment = (
        "Tiny stand-in for Kimi-K2.5's tiktoken tokenizer; no weights. "
        "See scripts/build_kimi_tiktoken_tokenizer.py."
    )
    write_model_files(out_dir, ids, VOCAB_END, comment)
    print(f"wrote {out_dir} ({len(ranks)} ranks, <think>={ids['<think>']})")


if __name__ == "__main__":
    build()
