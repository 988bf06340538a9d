"""SGLang 0.5.23 ``/generate``: request parsing and validation, stop semantics, response shape."""

from __future__ import annotations

import hashlib
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
from sglang_emulator.images import KimiImages, process
from sglang_emulator.logprobs import Scored
from sglang_emulator.sampling import Sampling, check_sampling_contract, resolve_cached
from sglang_emulator.speculation import SpecCounters
from sglang_emulator.vocab import Vocab

ABORTED = {"type": "abort", "message": "Aborted", "status_code": None, "err_type": None}


def _pack_checked(ids: list[int]) -> bytes:
    """The same bytes for ids in [0, 2**32); the unsigned format rejects negatives and
    non-integers in the same C pass, so only the upper vocabulary bound is left to check."""
    return struct.pack(f"<{len(ids)}I", *ids)


@dataclass(slots=True)
class Item:
    """One validated ``/generate`` request: a single prompt, as the pipeline sends it."""

    rid: str
    input_ids: list[int]
    packed: bytes  # the ids as little-endian int32, for fast scans and the digest
    digest: bytes
    sampling: Sampling
    seed: int
    max_new: int
    images: bytes = b""  # digest of the request's images (image_data); b"" without
    top_logprobs: int | None = None  # return_logprob: top_logprobs_num; None: not asked
    logprob_text: bool = False  # return_text_in_logprobs


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


_I64 = range(-(1 << 63), 1 << 63)


def _check_ids(ids: Any, vocab_size: int) -> tuple[list[int], bytes]:
    """Contract check of one prompt's ids (i64 each); returns the packing.

    Like SGLang 0.5.23, no vocabulary range check: an id outside the vocabulary is accepted
    (SGLang hands it to the model unchecked). Such ids are packed modulo 2**32.
    """
    if not isinstance(ids, list):
        raise invalid_type(ids, "a sequence")
    if not ids:
        return ids, b""
    try:
        return ids, _pack_checked(ids)
    except struct.error:
        for e in ids:
            if not is_int(e) or e not in _I64:
                raise invalid_type(e, "i64") from None
    return ids, struct.pack(f"<{len(ids)}I", *(t & 0xFFFFFFFF for t in ids))


# Request fields SGLang accepts that the pipeline never sends; the emulator refuses them.
UNSUPPORTED = (
    "text",
    "input_embeds",
    "stream",
    "return_prompt_token_ids",
    "token_ids_logprob",
    "return_flat_raw_top_logprobs",
    "return_flat_raw_output_top_logprobs",
)


def _logprob_request(body: dict[str, Any]) -> tuple[int | None, bool]:
    """(top_logprobs_num, return_text_in_logprobs) of a request with ``return_logprob``,
    (None, False) without; SGLang ignores the other logprob fields then (scheduler.py)."""
    if not body.get("return_logprob"):
        return None, False
    start = body.get("logprob_start_len")
    if start not in (None, -1):
        raise unsupported("Prompt logprobs (logprob_start_len other than -1)")
    top = body.get("top_logprobs_num")
    if top is None:
        top = 0
    if not is_int(top) or top < 0:
        raise invalid_type(top, "a non-negative top_logprobs_num")
    return int(top), bool(body.get("return_text_in_logprobs"))


def unsupported(what: str) -> GenerateValueError:
    return GenerateValueError(f"{what} is not supported by the SGLang emulator.")


def parse_generate(
    body: Any,
    limits: Limits,
    default_seed: int,
    inflight: dict[str, Any] | set[str],
    media: KimiImages | None = None,
) -> Item:
    """Validate a single-prompt ``/generate`` body (``input_ids`` + ``sampling_params`` +
    ``rid``) in SGLang's order, raising ``ApiError`` with SGLang's body for each failure."""
    _type_checks(body)
    assert isinstance(body, dict)
    sp = body.get("sampling_params")
    if isinstance(sp, list):
        raise unsupported("A list of sampling_params (batch request)")
    sp = check_sampling_contract(sp) if sp is not None else {}
    for key in UNSUPPORTED:
        if body.get(key) not in (None, False):
            raise unsupported(f"'{key}'")
    ids = body.get("input_ids")
    if ids is None:
        raise GenerateValueError("Either text, input_ids or input_embeds should be provided.")
    if len(ids) == 0:
        raise GenerateValueError("input_ids cannot be empty.")
    if isinstance(ids[0], list):
        raise unsupported("A list of input_ids lists (batch request)")
    prompt, packed = _check_ids(ids, limits.vocab_size)
    # SGLang tokenizes (expands the images) before its length checks, which see the expansion.
    prompt, images = process(prompt, body.get("image_data"), media)
    if images:
        packed = _pack_checked(prompt)
    if sp.get("n") not in (None, 1):
        raise unsupported("n > 1 (parallel sampling)")
    if sp.get("stop") or sp.get("stop_regex"):
        raise unsupported("A stop string (stop, stop_regex)")

    rid = body.get("rid")
    if isinstance(rid, list):
        raise unsupported("A list of rids (batch request)")
    rid = rid if isinstance(rid, str) else uuid.uuid4().hex
    if rid in inflight:
        raise GenerateValueError(f"Duplicate request ID detected: {rid}")

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
    seed = sampling.sampling_seed if sampling.sampling_seed is not None else default_seed
    digest = hashlib.sha256(packed + images).digest()
    top, text = _logprob_request(body)
    return Item(rid, prompt, packed, digest, sampling, seed, max_new, images, top, text)


@dataclass(slots=True)
class Result:
    """What one item produced: exactly the ids sent to the client, and how it finished."""

    output_ids: list[int]
    finish_reason: dict[str, Any]
    text: str
    stop_trim: int = 0  # ids excluded from ``text`` (the matched stop token)
    counters: SpecCounters | None = None  # a real draft's verify counts (backend.Generation)
    rows: list[Scored] | None = None  # a real model's logprob rows (backend.Generation)


def _first_stop(stream: list[int], stops: frozenset[int] | set[int], start: int) -> int:
    for pos in range(start, len(stream)):
        if stream[pos] in stops:
            return pos
    return -1


def run_item(item: Item, stream: list[int], vocab: Vocab) -> Result:
    """SGLang's stop rules on a backend's output stream: the matched stop id stays in
    ``output_ids``; at most ``max_new`` ids."""
    s = item.sampling
    stream = stream[: item.max_new]
    stops: frozenset[int] = frozenset() if s.ignore_eos else s.stop_token_ids | vocab.eos_ids
    pos = _first_stop(stream, stops, s.min_new_tokens) if stops else -1
    ids = stream[: pos + 1] if pos >= 0 else stream
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


def meta_info(
    item: Item,
    result_ids: list[int],
    finish: dict[str, Any] | None,
    cached: int,
) -> dict[str, Any]:
    """``meta_info`` with the v0.5.23 keys; the caller adds the timing keys."""
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
