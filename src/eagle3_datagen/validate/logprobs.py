"""The checks of a record's logprob columns (docs/logprobs.md), live on an answer and offline
on a stored record: one value per output token, finite, scored on the output's own ids, and
the sampled token's logprob agreeing with the top-K where the top-K holds it."""

from __future__ import annotations

import math
from collections.abc import Sequence

from eagle3_datagen.validate.tokens import Verdict

# Both values come from one float32 tensor (SGLang's sampler), so they agree to its rounding.
_TOLERANCE = 1e-4


def check_logprobs(
    output_ids: Sequence[int],
    logprobs: Sequence[float | None] | None,
    v: Verdict,
    *,
    scored_ids: Sequence[int] | None = None,
    top_ids: Sequence[Sequence[int]] | None = None,
    top_logprobs: Sequence[Sequence[float]] | None = None,
    top_k: int = 0,
) -> None:
    """Add a reason to ``v`` for each rule the logprob columns break. ``scored_ids``: the ids
    SGLang says it scored (live answers; stored records keep only ``output_ids``)."""
    n = len(output_ids)
    if logprobs is None or len(logprobs) != n:
        got = "none" if logprobs is None else len(logprobs)
        v.fail("logprobs_length", f"{got} output logprobs for {n} output tokens")
        return
    if scored_ids is not None and list(scored_ids) != list(output_ids):
        at = next(
            (i for i, (a, b) in enumerate(zip(scored_ids, output_ids, strict=False)) if a != b), n
        )
        v.fail("logprobs_ids", f"the logprobs score other ids than the output, from position {at}")
        return
    bad = next((i for i, lp in enumerate(logprobs) if not _is_logprob(lp)), None)
    if bad is not None:
        v.fail("logprob_not_finite", f"output logprob {logprobs[bad]!r} at position {bad}")
        return
    if top_k > 0:
        _check_top(output_ids, logprobs, top_ids, top_logprobs, top_k, v)


def _is_logprob(lp: float | None) -> bool:
    return lp is not None and math.isfinite(lp) and lp <= _TOLERANCE


def _all_logprobs(lps: Sequence[float]) -> bool:
    """Every value finite and not above 0, in two C-speed passes: a float64 sum of float32
    logprobs is finite exactly when each is (NaN and infinities carry through)."""
    try:
        return math.isfinite(sum(lps)) and max(lps) <= _TOLERANCE
    except TypeError:  # a null
        return False


def _check_top(
    output_ids: Sequence[int],
    logprobs: Sequence[float | None],
    top_ids: Sequence[Sequence[int]] | None,
    top_logprobs: Sequence[Sequence[float]] | None,
    top_k: int,
    v: Verdict,
) -> None:
    n = len(output_ids)
    if top_ids is None or top_logprobs is None or len(top_ids) != n or len(top_logprobs) != n:
        got = "none" if top_ids is None else len(top_ids)
        v.fail("top_logprobs_length", f"{got} top-K rows for {n} output tokens")
        return
    for i, (ids, lps) in enumerate(zip(top_ids, top_logprobs, strict=True)):
        if len(ids) != len(lps) or len(ids) > top_k:
            v.fail("top_logprobs_length", f"{len(ids)} ids, {len(lps)} logprobs at position {i}")
            return
        if lps and not _all_logprobs(lps):
            v.fail("logprob_not_finite", f"top-K logprobs {list(lps)!r} at position {i}")
            return
        sampled = logprobs[i]
        assert sampled is not None
        if output_ids[i] in ids:
            own = lps[list(ids).index(output_ids[i])]
            if abs(own - sampled) > _TOLERANCE:
                v.fail(
                    "logprob_mismatch",
                    f"position {i}: sampled token's logprob {sampled} but {own} in its top-K",
                )
                return
        elif len(ids) == top_k and lps and sampled > min(lps) + _TOLERANCE:
            v.fail(
                "logprob_mismatch",
                f"position {i}: sampled token's logprob {sampled} is above its top-K's "
                f"lowest {min(lps)}, but the token is not in them",
            )
            return
