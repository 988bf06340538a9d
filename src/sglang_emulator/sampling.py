"""Sampling params as SGLang 0.5.23 reads them: the contract check, ``__post_init__``, ``verify()``.

Only ``max_new_tokens``, the stop-token rules, ``skip_special_tokens``, ``sampling_seed`` and
greedy (``temperature`` 0) change the emulator's output; every other value is still validated
(stop strings and ``n`` > 1 are refused by the request parser).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import orjson

from sglang_emulator.errors import ContractError, GenerateValueError, invalid_type, is_int

TOP_K_ALL = 1 << 30
_SAMPLING_EPS = 1e-6
DEFAULT_MAX_NEW_TOKENS = 128

_SAMPLING_FIELDS = (
    "max_new_tokens",
    "stop",
    "stop_token_ids",
    "stop_regex",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "frequency_penalty",
    "presence_penalty",
    "repetition_penalty",
    "min_new_tokens",
    "n",
    "json_schema",
    "regex",
    "ebnf",
    "structural_tag",
    "ignore_eos",
    "skip_special_tokens",
    "spaces_between_special_tokens",
    "no_stop_trim",
    "stream_interval",
    "logit_bias",
    "sampling_seed",
    "custom_params",
    "beam_width",
    "watermark",
    "choice",
)
_INT_FIELDS = frozenset(
    {"max_new_tokens", "top_k", "min_new_tokens", "n", "stream_interval", "sampling_seed"}
    | {"beam_width"}
)
_FLOAT_FIELDS = frozenset(
    {"temperature", "top_p", "min_p", "frequency_penalty", "presence_penalty"}
    | {"repetition_penalty"}
)
_BOOL_FIELDS = frozenset(
    {"ignore_eos", "skip_special_tokens", "spaces_between_special_tokens", "no_stop_trim"}
)
_STR_FIELDS = frozenset({"json_schema", "regex", "ebnf", "structural_tag"})


@dataclass(slots=True)
class Sampling:
    """Resolved sampling params of one item (after SGLang's ``__post_init__``)."""

    max_new_tokens: int | None = DEFAULT_MAX_NEW_TOKENS
    max_new_given: bool = False
    stop: list[str] = field(default_factory=list)
    stop_regex: list[str] = field(default_factory=list)
    stop_token_ids: frozenset[int] = frozenset()
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = TOP_K_ALL
    min_p: float = 0.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0
    min_new_tokens: int = 0
    n: int = 1
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    no_stop_trim: bool = False
    stream_interval: int | None = None
    sampling_seed: int | None = None
    logit_bias: dict[str, float] = field(default_factory=dict)
    grammars: int = 0

    @property
    def greedy(self) -> bool:
        return self.top_k == 1


def check_sampling_contract(sp: Any) -> dict[str, Any]:
    """The contract decoder for one sampling-params object (unknown keys rejected)."""
    if not isinstance(sp, dict):
        raise invalid_type(sp, "struct SamplingParams")
    for key, x in sp.items():
        if key not in _SAMPLING_FIELDS:
            listed = ", ".join(f"`{f}`" for f in _SAMPLING_FIELDS)
            raise ContractError(f"unknown field `{key}`, expected one of {listed}")
        if x is None or key in ("custom_params", "watermark"):
            continue
        if key in _INT_FIELDS and not is_int(x):
            raise invalid_type(x, "i64")
        if key in _FLOAT_FIELDS and not (is_int(x) or isinstance(x, float)):
            raise invalid_type(x, "f64")
        if key in _BOOL_FIELDS and not isinstance(x, bool):
            raise invalid_type(x, "a boolean")
        if key in _STR_FIELDS and not isinstance(x, str):
            raise invalid_type(x, "a string")
        if key in ("stop", "stop_regex"):
            if isinstance(x, list):
                for e in x:
                    if not isinstance(e, str):
                        raise invalid_type(e, "a string")
            elif not isinstance(x, str):
                raise invalid_type(x, "a value or an array of values for StringOrList")
        if key == "stop_token_ids":
            if not isinstance(x, list):
                raise invalid_type(x, "a sequence")
            for e in x:
                if not is_int(e):
                    raise invalid_type(e, "i64")
        if key == "logit_bias":
            if not isinstance(x, dict):
                raise invalid_type(x, "a map")
            for e in x.values():
                if not (is_int(e) or isinstance(e, float)):
                    raise invalid_type(e, "f64")
        if key == "choice" and not isinstance(x, list):
            raise invalid_type(x, "a sequence")
    return sp


def resolve_sampling(sp: dict[str, Any], vocab_size: int) -> Sampling:
    """SGLang's ``SamplingParams.__post_init__`` followed by ``verify()``."""
    s = Sampling()
    if "max_new_tokens" in sp:
        s.max_new_tokens = sp["max_new_tokens"]
        s.max_new_given = sp["max_new_tokens"] is not None

    def get(key: str, default: Any) -> Any:
        value = sp.get(key)
        return default if value is None else value

    stop = sp.get("stop")
    s.stop = [stop] if isinstance(stop, str) else list(stop or [])
    s.stop = [x for x in s.stop if x]
    regex = sp.get("stop_regex")
    s.stop_regex = [regex] if isinstance(regex, str) else list(regex or [])
    s.stop_token_ids = frozenset(int(t) for t in (sp.get("stop_token_ids") or []))
    s.temperature = float(get("temperature", 1.0))
    s.top_p = float(get("top_p", 1.0))
    top_k = int(get("top_k", -1))
    s.top_k = TOP_K_ALL if top_k == -1 else top_k
    s.min_p = float(get("min_p", 0.0))
    s.frequency_penalty = float(get("frequency_penalty", 0.0))
    s.presence_penalty = float(get("presence_penalty", 0.0))
    s.repetition_penalty = float(get("repetition_penalty", 1.0))
    s.min_new_tokens = int(get("min_new_tokens", 0))
    s.n = int(get("n", 1))
    s.ignore_eos = bool(get("ignore_eos", False))
    s.skip_special_tokens = bool(get("skip_special_tokens", True))
    s.no_stop_trim = bool(get("no_stop_trim", False))
    s.stream_interval = sp.get("stream_interval")
    s.sampling_seed = sp.get("sampling_seed")
    s.logit_bias = dict(sp.get("logit_bias") or {})
    s.grammars = sum(1 for k in ("json_schema", "regex", "ebnf", "structural_tag") if sp.get(k))
    if 0 <= s.temperature < _SAMPLING_EPS:
        s.temperature = 1.0
        s.top_k = 1
    _verify(s, vocab_size, beam_width=sp.get("beam_width"))
    return s


_SAMPLING_CACHE: dict[bytes, Sampling] = {}


def resolve_cached(sp: dict[str, Any], vocab_size: int) -> Sampling:
    """A client sends the same few sampling dicts over and over; resolve each once."""
    try:
        key = orjson.dumps(sp, option=orjson.OPT_SORT_KEYS) + vocab_size.to_bytes(8, "little")
    except TypeError:
        return resolve_sampling(sp, vocab_size)
    hit = _SAMPLING_CACHE.get(key)
    if hit is None:
        hit = resolve_sampling(sp, vocab_size)  # raises for invalid params: never cached
        if len(_SAMPLING_CACHE) > 4096:
            _SAMPLING_CACHE.clear()
        _SAMPLING_CACHE[key] = hit
    return hit


def _verify(s: Sampling, vocab_size: int, beam_width: int | None) -> None:
    if beam_width is not None and beam_width < 1:
        raise GenerateValueError(f"beam_width must be at least 1, got {beam_width}.")
    if not math.isfinite(s.temperature) or s.temperature < 0.0:
        raise GenerateValueError(
            f"temperature must be a non-negative finite number, got {s.temperature}."
        )
    if not 0.0 < s.top_p <= 1.0:
        raise GenerateValueError(f"top_p must be in (0, 1], got {s.top_p}.")
    if not 0.0 <= s.min_p <= 1.0:
        raise GenerateValueError(f"min_p must be in [0, 1], got {s.min_p}.")
    if s.top_k < 1:
        raise GenerateValueError(f"top_k must be -1 (disable) or at least 1, got {s.top_k}.")
    if not -2.0 <= s.frequency_penalty <= 2.0:
        raise GenerateValueError(
            f"frequency_penalty must be in [-2, 2], got {s.frequency_penalty}."
        )
    if not -2.0 <= s.presence_penalty <= 2.0:
        raise GenerateValueError(f"presence_penalty must be in [-2, 2], got {s.presence_penalty}.")
    if not 0.0 < s.repetition_penalty <= 2.0:
        raise GenerateValueError(
            f"repetition_penalty must be in (0, 2] (1.0 = no penalty), got {s.repetition_penalty}."
        )
    if s.min_new_tokens < 0:
        raise GenerateValueError(
            f"min_new_tokens must be in [0, max_new_tokens], got {s.min_new_tokens}."
        )
    if s.max_new_tokens is not None:
        if s.max_new_tokens < 0:
            raise GenerateValueError(f"max_new_tokens must be at least 0, got {s.max_new_tokens}.")
        if s.min_new_tokens > s.max_new_tokens:
            raise GenerateValueError(
                f"min_new_tokens must be in [0, max_new_tokens({s.max_new_tokens})], got "
                f"{s.min_new_tokens}."
            )
    for token_id in s.logit_bias:
        try:
            ok = 0 <= int(token_id) < vocab_size
        except ValueError:
            ok = False
        if not ok:
            raise GenerateValueError(
                f"logit_bias must has keys in [0, {vocab_size - 1}], got {token_id}."
            )
    if s.sampling_seed is not None and not -(2**63) <= s.sampling_seed <= 2**63 - 1:
        raise GenerateValueError(
            f"sampling_seed must be in [-2**63, 2**63 - 1], got {s.sampling_seed}."
        )
    if s.grammars > 1:
        raise GenerateValueError(
            "Only one of json_schema, regex, ebnf, or structural_tag can be set."
        )
