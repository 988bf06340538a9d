"""SGLang 0.5.23's logprob fields for the fake model's tokens: a deterministic made-up
distribution per output token, in SGLang's shapes (``TokenizerManager.add_logprob_to_meta_info``:
``[logprob, token_id, text|null]`` triples, top-K lists highest first).

The tokens are drawn as before; only the distribution around each is invented. Per position the
probabilities fall geometrically from the top (the rest of the vocabulary holds what they leave),
the sampled token sits at rank 0 mostly, lower sometimes, past the top-K now and then (always
rank 0 when greedy), and its logprob is its rank's, so it equals its top-K entry when there.
Sampled rows are now and then peaked: past their first one or two ranks the top-K holds
``NO_MASS`` entries, as SGLang 0.5.23 sends them (tests/fixtures/sglang-0.5.23/generate_logprobs_*).
"""

from __future__ import annotations

import hashlib
import math
import random
from array import array
from collections.abc import Callable
from typing import Any

# A real model's logprob row of one output token: (the token's logprob, the row's top-K
# (logprob, id), highest first).
Scored = tuple[float, list[tuple[float, int]]]

Triple = list[Any]  # [logprob, token_id, text | None], as SGLang's tuples serialize
# A top-K entry of probability 0: SGLang clamps -inf to float32's lowest value
# (layers/logprob_processor.py:926), so it is sent as this number, never as null.
NO_MASS = -3.4028234663852886e38


def _ranks(rng: random.Random, k: int, greedy: bool) -> tuple[list[float], int, int]:
    """Probabilities of ranks 0..k (k + 1 of them), the sampled token's rank and how many ranks
    hold any mass (the rest underflowed to 0: SGLang clamps their -inf to ``NO_MASS``)."""
    ratio = rng.uniform(0.05, 0.7)
    mass = rng.uniform(0.5, 0.99)  # the geometric series' total; the rest is the tail
    first = (1.0 - ratio) * mass
    probs = [first * ratio**j for j in range(k + 1)]
    u = rng.random()
    if greedy or u < 0.75:
        rank = 0
    elif u < 0.9:
        rank = 1
    else:
        rank = rng.randint(1, k)
    live = k + 1
    # Sampling takes log(softmax(logits / T)) (layers/sampler.py), which is -inf where a
    # probability underflowed: a peaked row. Greedy takes log_softmax, finite everywhere.
    if not greedy and rng.random() < 0.1:
        live = rng.randint(1, 2)
        rank = min(rank, live - 1)
    return probs, rank, live


def fake_logprobs(
    output_ids: list[int],
    seed_key: bytes,
    *,
    top_k: int,
    vocab_size: int,
    greedy: bool,
    text: Callable[[int], str] | None = None,
) -> dict[str, Any]:
    """The ``meta_info`` logprob fields for ``output_ids`` (prompt logprobs: none, as with
    ``logprob_start_len`` -1). ``seed_key``: the same request gets the same numbers."""
    rng = random.Random(hashlib.blake2b(seed_key, digest_size=8).digest())
    sampled: list[float] = []
    rows: list[list[tuple[float, int]]] = []
    for token in output_ids:
        probs, rank, live = _ranks(rng, max(top_k, 1), greedy)
        lps = array("f", [math.log(p) for p in probs]).tolist()  # float32, as SGLang's tensors
        lps[live:] = [NO_MASS] * (len(lps) - live)
        sampled.append(lps[rank])
        if top_k > 0:
            others = iter(_others(rng, token, top_k, vocab_size))
            rows.append([(lps[j], token if j == rank else next(others)) for j in range(top_k)])

    def triple(lp: float, tid: int) -> Triple:
        return [lp, tid, text(tid) if text is not None else None]

    meta: dict[str, Any] = {
        "input_token_logprobs": [],
        "output_token_logprobs": [triple(lp, t) for lp, t in zip(sampled, output_ids, strict=True)],
        "output_token_logprobs_length": len(output_ids),
    }
    if top_k > 0:
        meta["input_top_logprobs"] = []
        meta["output_top_logprobs"] = [[triple(lp, t) for lp, t in row] for row in rows]
    return meta


def real_logprobs(
    output_ids: list[int],
    rows: list[Scored],
    top_k: int,
    text: Callable[[int], str] | None = None,
) -> dict[str, Any]:
    """The same fields from a real model's numbers: per output token its logprob and the top-K
    ``(logprob, id)`` of its row (a real backend's ``Generation.rows``)."""

    def triple(lp: float, tid: int) -> Triple:
        return [lp, tid, text(tid) if text is not None else None]

    meta: dict[str, Any] = {
        "input_token_logprobs": [],
        "output_token_logprobs": [
            triple(lp, t) for (lp, _), t in zip(rows, output_ids, strict=True)
        ],
        "output_token_logprobs_length": len(output_ids),
    }
    if top_k > 0:
        meta["input_top_logprobs"] = []
        meta["output_top_logprobs"] = [[triple(lp, t) for lp, t in top] for _, top in rows]
    return meta


def _others(rng: random.Random, token: int, k: int, vocab_size: int) -> list[int]:
    """``k`` distinct ids other than ``token``."""
    chosen: set[int] = set()
    out: list[int] = []
    while len(out) < k and len(chosen) < vocab_size - 1:
        tid = rng.randrange(vocab_size)
        if tid != token and tid not in chosen:
            chosen.add(tid)
            out.append(tid)
    return out


def with_logprob_fields(meta: dict[str, Any], fields: dict[str, Any]) -> dict[str, Any]:
    """``meta`` with the logprob fields after ``num_retractions``, where SGLang 0.5.23's
    ``meta_info`` carries them (key order as the recorded fixtures hold it)."""
    out: dict[str, Any] = {}
    for key, value in meta.items():
        out[key] = value
        if key == "num_retractions":
            out.update(fields)
    return out
