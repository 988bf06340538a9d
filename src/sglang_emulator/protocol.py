"""SGLang 0.5.23 ``/generate``: request parsing and validation, stop semantics, response shape."""

from __future__ import annotations

import hashlib
import re
import struct
import uuid
from dataclasses import dataclass
from typing import Any

from sglang_emulator.errors import (
    GenerateValueError,
    invalid_type,
    is_int,
    pydantic_error,
)
from sglang_emulator.fake_model import FakeModel
from sglang_emulator.sampling import Sampling, check_sampling_contract, resolve_cached
from sglang_emulator.vocab import Vocab, pack_int32

ABORTED = {"type": "abort", "message": "Aborted", "status_code": None, "err_type": None}


def _pack_checked(ids: list[int]) -> bytes:
    """The same bytes for ids in [0, 2**32); the unsigned format rejects negatives and
    non-integers in the same C pass, so only the upper vocabulary bound is left to check."""
    return struct.pack(f"<{len(ids)}I", *ids)


@dataclass(slots=True)
class Item:
    """One sequence to generate (a batch entry, or one of ``n`` parallel samples)."""

    rid: str
    input_ids: list[int]
    packed: bytes  # the ids as little-endian int32, for fast scans and the digest
    digest: bytes
    sampling: Sampling
    seed: int
    max_new: int
    sample_index: int = 0
    index: int = 0


@dataclass(slots=True)
class GenerateRequest:
    """A validated ``/generate`` body."""

    items: list[Item]
    is_single: bool
    stream: bool
    return_prompt_token_ids: bool = False


@dataclass(frozen=True)
class Limits:
    """Length limits SGLang derives from the context length and the KV pool."""

    context_len: int
    max_total_num_tokens: int
    vocab_size: int

    @property
    def max_req_len(self) -> int:
        return min(self.context_len - 1, self.max_total_num_tokens - 1)

    @property
    def max_req_input_len(self) -> int:
        return self.max_req_len - 5


def _type_checks(body: Any) -> None:
    """The pydantic layer: shapes FastAPI rejects before SGLang sees the body."""
    if not isinstance(body, dict):
        raise pydantic_error(
            (),
            "Input should be a valid dictionary or object to extract fields from",
            "dataclass_type",
            body,
        )
    ids = body.get("input_ids")
    if ids is not None and not isinstance(ids, list):
        raise pydantic_error(("input_ids",), "Input should be a valid list", "list_type", ids)
    rid = body.get("rid")
    if rid is not None and not isinstance(rid, (str, list)):
        raise pydantic_error(("rid",), "Input should be a valid string", "string_type", rid)
    if isinstance(rid, list):
        for i, r in enumerate(rid):
            if not isinstance(r, str):
                raise pydantic_error(
                    ("rid", str(i)), "Input should be a valid string", "string_type", r
                )
    sp = body.get("sampling_params")
    if sp is not None and not isinstance(sp, (dict, list)):
        raise pydantic_error(
            ("sampling_params",), "Input should be a valid dictionary", "dict_type", sp
        )
    text = body.get("text")
    if text is not None and not isinstance(text, (str, list)):
        raise pydantic_error(("text",), "Input should be a valid string", "string_type", text)


def _check_ids(ids: Any, vocab_size: int) -> tuple[list[int], bytes]:
    """Contract check of one prompt's ids (plus a vocabulary range check); returns the packing."""
    if not isinstance(ids, list):
        raise invalid_type(ids, "a sequence")
    if not ids:
        return ids, b""
    packed: bytes | None
    try:
        packed = _pack_checked(ids)
    except struct.error:
        for e in ids:
            if not is_int(e):
                raise invalid_type(e, "i64") from None
        packed = None  # out of range: reported below
    if packed is None or max(ids) >= vocab_size:
        bad = next(t for t in ids if t < 0 or t >= vocab_size)
        # SGLang would index the embedding out of range; the emulator refuses instead.
        raise GenerateValueError(
            f"Token id {bad} in input_ids is out of the vocabulary range [0, {vocab_size})."
        )
    return ids, packed


def parse_generate(
    body: Any,
    vocab: Vocab,
    limits: Limits,
    default_seed: int,
    inflight: dict[str, Any] | set[str],
) -> GenerateRequest:
    """Validate a ``/generate`` body and expand it into items, raising ``ApiError``."""
    _type_checks(body)
    assert isinstance(body, dict)
    stream = body.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise invalid_type(stream, "a boolean")
    stream = bool(stream)
    sp_raw = body.get("sampling_params")
    if isinstance(sp_raw, list):
        sp_list: list[dict[str, Any]] | None = [check_sampling_contract(x) for x in sp_raw]
    elif sp_raw is not None:
        sp_list = None
        check_sampling_contract(sp_raw)
    else:
        sp_list = None
    text = body.get("text")
    ids = body.get("input_ids")
    if isinstance(text, list):
        for t in text:
            if not isinstance(t, str):
                raise invalid_type(t, "a string")

    # normalize_batch_and_arguments
    if body.get("input_embeds") is not None and ids is None and text is None:
        raise GenerateValueError("input_embeds is not supported by the SGLang emulator.")
    if text is None and ids is None:
        raise GenerateValueError("Either text, input_ids or input_embeds should be provided.")
    prompts: list[list[int]]
    if ids is not None:
        if len(ids) == 0:
            raise GenerateValueError("input_ids cannot be empty.")
        is_single = not isinstance(ids[0], list)
        checked = [_check_ids(p, limits.vocab_size) for p in ([ids] if is_single else ids)]
    else:
        is_single = isinstance(text, str)
        texts = [text] if isinstance(text, str) else list(text or [])
        encoded = [vocab.encode(t, add_special_tokens=True) for t in texts]
        checked = [(e, pack_int32(e)) for e in encoded]
    prompts = [c[0] for c in checked]
    batch_size = len(prompts)

    if sp_list is None:
        sp_list = [sp_raw if isinstance(sp_raw, dict) else {}] * batch_size
    elif is_single:
        sp_list = sp_list[:1] or [{}]
    n_values = {int(sp.get("n") or 1) for sp in sp_list}
    if len(n_values) > 1:
        raise GenerateValueError(
            "The parallel_sample_num should be the same for all samples in sample params."
        )
    n = n_values.pop() if n_values else 1
    if n > 1 and is_single:
        is_single = False
    if not is_single and len(sp_list) != batch_size:
        raise GenerateValueError("The length of sampling_params should be equal to the batch size.")

    rid = body.get("rid")
    num = batch_size * n
    rids: list[str]
    if is_single:
        rids = [rid if isinstance(rid, str) else uuid.uuid4().hex]
    elif n > 1:
        # SGLang regenerates the rid of every parallel sample.
        rids = [uuid.uuid4().hex for _ in range(num)]
    elif rid is None:
        rids = [uuid.uuid4().hex for _ in range(num)]
    elif isinstance(rid, str):
        rids = [f"{rid}_{i}" for i in range(num)]
    else:
        if len(rid) != batch_size:
            raise GenerateValueError(
                "The specified rids length mismatch with the batch_size for batch processing."
            )
        rids = list(rid)
    if len(set(rids)) != len(rids):
        dups = sorted({r for r in rids if rids.count(r) > 1})
        raise GenerateValueError(f"Duplicate request IDs detected within the request: {dups}")
    for r in rids:
        if r in inflight:
            raise GenerateValueError(f"Duplicate request ID detected: {r}")

    items: list[Item] = []
    for i, prompt in enumerate(prompts):
        sp = sp_list[i]
        if not prompt:
            raise GenerateValueError("input_ids cannot be empty.")
        n_in = len(prompt)
        if n_in >= limits.context_len:
            raise GenerateValueError(
                f"The input ({n_in} tokens) is longer than the model's context length "
                f"({limits.context_len} tokens)."
            )
        mnt = sp.get("max_new_tokens")
        if isinstance(mnt, int) and mnt + n_in > limits.context_len:
            raise GenerateValueError(
                "Requested token count exceeds the model's maximum context length "
                f"of {limits.context_len} tokens. You requested a total of {mnt + n_in} "
                f"tokens: {n_in} tokens from the input messages and "
                f"{mnt} tokens for the completion. Please reduce the number "
                "of tokens in the input messages or the completion to fit within the limit."
            )
        sampling = resolve_cached(sp, limits.vocab_size)
        if n_in >= limits.max_req_input_len:
            raise GenerateValueError(
                f"Input length ({n_in} tokens) exceeds the maximum allowed length "
                f"({limits.max_req_input_len} tokens). Use a shorter input or enable "
                "--allow-auto-truncate."
            )
        # Scheduler.init_req_max_new_tokens: None means "up to the context".
        requested = sampling.max_new_tokens if sampling.max_new_tokens is not None else 1 << 30
        max_new = max(0, min(requested, limits.max_req_len - n_in - 1))
        digest = hashlib.sha256(checked[i][1]).digest()
        seed = sampling.sampling_seed if sampling.sampling_seed is not None else default_seed
        for j in range(n):
            idx = i * n + j
            items.append(
                Item(rids[idx], prompt, checked[i][1], digest, sampling, seed, max_new, j, idx)
            )
    echo = body.get("return_prompt_token_ids")
    if echo is not None and not isinstance(echo, bool):
        raise invalid_type(echo, "a boolean")
    return GenerateRequest(items, is_single, stream, bool(echo))


@dataclass(slots=True)
class Result:
    """What one item produced: exactly the ids sent to the client, and how it finished."""

    output_ids: list[int]
    finish_reason: dict[str, Any]
    text: str
    stop_trim: int = 0  # ids excluded from ``text`` (the matched stop token)
    text_cut: int | None = None  # a stop string cut ``text`` at this character


def _first_stop(stream: list[int], stops: frozenset[int] | set[int], start: int) -> int:
    for pos in range(start, len(stream)):
        if stream[pos] in stops:
            return pos
    return -1


def _stop_string(ids: list[int], s: Sampling, vocab: Vocab) -> tuple[int, str, int, int] | None:
    """Earliest stop string/regex match: (ids kept, matched, match start, match end)."""
    text = vocab.decode(ids, s.skip_special_tokens)
    best: tuple[int, int, str] | None = None
    for stop in s.stop:
        pos = text.find(stop)
        if pos >= 0 and (best is None or pos < best[0]):
            best = (pos, pos + len(stop), stop)
    for pattern in s.stop_regex:
        m = re.search(pattern, text)
        if m and (best is None or m.start() < best[0]):
            best = (m.start(), m.end(), pattern)
    if best is None:
        return None
    start, end, matched = best
    needle = text[start:end]
    lo, hi = 1, len(ids)
    while lo < hi:  # the shortest prefix whose text contains the match
        mid = (lo + hi) // 2
        if needle in vocab.decode(ids[:mid], s.skip_special_tokens):
            hi = mid
        else:
            lo = mid + 1
    return lo, matched, start, end


def run_item(item: Item, model: FakeModel, vocab: Vocab) -> Result:
    """Generate and apply SGLang's stop rules: the matched stop id stays in ``output_ids``."""
    s = item.sampling
    seed = 0 if s.greedy else item.seed
    digest = (
        item.digest
        if item.sample_index == 0 or s.greedy
        else (item.digest + item.sample_index.to_bytes(8, "little"))
    )
    stream = model.generate(item.input_ids, digest, seed, item.max_new, item.packed)
    stops: frozenset[int] = frozenset() if s.ignore_eos else s.stop_token_ids | vocab.eos_ids
    pos = _first_stop(stream, stops, s.min_new_tokens) if stops else -1
    ids = stream[: pos + 1] if pos >= 0 else stream
    if s.stop or s.stop_regex:
        hit = _stop_string(ids, s, vocab)
        if hit is not None and (pos < 0 or hit[0] <= pos):
            kept, matched, start, end = hit
            ids = ids[:kept]
            full = vocab.decode(ids, s.skip_special_tokens)
            cut = end if s.no_stop_trim else start
            return Result(ids, {"type": "stop", "matched": matched}, full[:cut], 0, cut)
    if pos >= 0:
        trim = 0 if s.no_stop_trim else 1
        text = vocab.decode(ids[: len(ids) - trim], s.skip_special_tokens)
        return Result(ids, {"type": "stop", "matched": ids[-1]}, text, trim)
    text = vocab.decode(ids, s.skip_special_tokens)
    return Result(ids, {"type": "length", "length": item.max_new}, text)


def truncate(
    result: Result, keep: int, vocab: Vocab, s: Sampling, reason: dict[str, Any]
) -> Result:
    """The partial result of an item cut off after ``keep`` ids (abort)."""
    ids = result.output_ids[:keep]
    return Result(ids, dict(reason), vocab.decode(ids, s.skip_special_tokens))


class IncrementalText:
    """Cumulative stream text decoded a few ids at a time, like SGLang's detokenizer.

    Re-decoding the whole prefix for every chunk would be quadratic; an incomplete UTF-8
    sequence (a trailing U+FFFD) is held back until the next ids complete it.
    """

    __slots__ = ("read", "skip_special", "surr", "text", "vocab")

    def __init__(self, vocab: Vocab, skip_special_tokens: bool) -> None:
        self.vocab = vocab
        self.skip_special = skip_special_tokens
        self.text = ""
        self.surr = 0
        self.read = 0

    def advance(self, ids: list[int], upto: int) -> str:
        prev = self.vocab.decode(ids[self.surr : self.read], self.skip_special)
        new = self.vocab.decode(ids[self.surr : upto], self.skip_special)
        if len(new) > len(prev) and not new.endswith("\ufffd"):
            self.text += new[len(prev) :]
            self.surr, self.read = self.read, upto
        return self.text


def meta_info(
    item: Item,
    result_ids: list[int],
    finish: dict[str, Any] | None,
    cached: int,
) -> dict[str, Any]:
    """``meta_info`` with the v0.5.23 keys; timing keys are added on the final chunk."""
    return {
        "id": item.rid,
        "finish_reason": finish,
        "prompt_tokens": len(item.input_ids),
        "weight_version": "default",
        "num_retractions": 0,
        "reasoning_tokens": 0,
        "completion_tokens": len(result_ids),
        "cached_tokens": cached,
    }
