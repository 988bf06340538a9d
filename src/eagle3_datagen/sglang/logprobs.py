"""The target's per-token distribution from the same ``/generate`` call: the request fields that
ask for it, and the ``meta_info`` fields SGLang 0.5.23 answers with (docs/sglang-api.md,
"Logprobs"; docs/logprobs.md says what the dataset keeps).

With ``return_logprob`` SGLang's ``TokenizerManager.add_logprob_to_meta_info``
(managers/tokenizer_manager.py) sends ``output_token_logprobs``: one ``[logprob, token_id,
text|null]`` per output token, and with ``top_logprobs_num`` K > 0 ``output_top_logprobs``: per
output token a list of K such triples, highest first (``null`` for a position with none).
A top-K entry whose probability underflowed to 0 does not arrive as -inf: SGLang clamps the
logprobs to float32's lowest value first (layers/logprob_processor.py:926,
``OutputLogprobProcessor.compute_logprobs``), so it is ``[-3.4028234663852886e+38, id, null]``,
its id one of many tied ones (proven on SGLang's own code, docs/sglang-conformance.md). The
body is written by orjson (utils/json_response.py), which writes NaN as ``null``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

# float32's lowest value: SGLang's clamp of -inf, a probability that underflowed to 0.
NO_MASS = -3.4028234663852886e38


def request_fields(top_k: int) -> dict[str, Any]:
    """The ``/generate`` fields that ask for output logprobs (and K alternatives per token).

    ``logprob_start_len: -1`` (SGLang's default, sent to say so) makes the scheduler score no
    prompt token (scheduler.py sets the start to the prompt's length) and leaves prefix caching
    alone; a start >= 0 caps the reusable prefix at it (schedule_batch.py).
    """
    return {"return_logprob": True, "logprob_start_len": -1, "top_logprobs_num": top_k}


@dataclass(slots=True)
class TokenLogprobs:
    """One answer's output logprobs as sent: nothing is repaired here (validate/tokens.py
    checks them; a record keeps them only when they pass)."""

    logprobs: list[float | None]  # the sampled token's, per output token
    token_ids: list[int]  # the ids SGLang says it scored: must be the output ids
    top_ids: list[list[int]] | None = None  # K > 0: per output token, highest first
    top_logprobs: list[list[float]] | None = None


def parse_logprobs(meta: dict[str, Any], top_k: int) -> TokenLogprobs:
    """The logprob fields of one ``meta_info``; a missing or malformed field raises
    KeyError, TypeError or ValueError (the client makes that a retryable server fault)."""
    triples = meta["output_token_logprobs"]
    logprobs = [_value(t[0]) for t in triples]
    token_ids = [int(t[1]) for t in triples]
    if top_k <= 0:
        return TokenLogprobs(logprobs, token_ids)
    top_ids: list[list[int]] = []
    top_values: list[list[float]] = []
    for row in meta["output_top_logprobs"]:
        # No mass (clamped -inf, or a NaN written as null): dropped, its id is arbitrary.
        kept = [t for t in row or () if t[0] is not None and t[0] > NO_MASS]
        top_ids.append([int(t[1]) for t in kept])
        top_values.append([float(t[0]) for t in kept])
    return TokenLogprobs(logprobs, token_ids, top_ids, top_values)


def _value(v: Any) -> float | None:
    return None if v is None else float(v)


@dataclass(frozen=True, slots=True)
class EntropySummary:
    """Per record: the mean and the 90th percentile over output tokens of the per-token
    entropy estimate :func:`token_entropy` (nats)."""

    mean: float
    p90: float


def token_entropy(top_logprobs: list[float]) -> float:
    """The entropy (nats) of one token's distribution, estimated from its top-K logprobs.

    The top-K entries contribute ``-p log p`` exactly. The tail mass ``r = 1 - sum(p)`` is
    counted as if it were one more token: ``-r log r``. Spreading ``r`` over more tokens only
    raises the entropy, so this is a lower bound of the true entropy (exact when ``r`` is 0);
    with K = 1 it is the binary entropy of the top token's probability.
    """
    total = 0.0
    mass = 0.0
    for lp in top_logprobs:
        p = math.exp(lp)
        mass += p
        if p > 0.0:
            total -= p * lp
    rest = 1.0 - mass
    if rest > 1e-12:
        total -= rest * math.log(rest)
    return max(total, 0.0)


def entropy_summary(top_logprobs: list[list[float]]) -> EntropySummary | None:
    """Mean and p90 (nearest rank) of the per-token estimates; None for no tokens."""
    if not top_logprobs:
        return None
    values = sorted(token_entropy(row) for row in top_logprobs)
    rank = max(math.ceil(0.9 * len(values)) - 1, 0)
    return EntropySummary(mean=math.fsum(values) / len(values), p90=values[rank])
