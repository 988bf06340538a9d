"""Speculative decoding as SGLang 0.5.23 reports it: the server's settings, per-request acceptance,
and acceptance summed over any slice of a run.

Why: a draft model's worth is its acceptance on the target server, and SGLang reports it per
request in ``/generate``'s ``meta_info`` when it runs with ``--speculative-algorithm``. Three
things here, each a pure function of what the server sent (docs/sglang-speculative.md has the
SGLang source behind every field and formula):

- :class:`SpeculativeSettings` — the ``speculative_*`` fields of ``/server_info``;
  :func:`lossy_reasons` names every setting under which the server's output is no longer the
  target model's own distribution (the pre-flight refuses such a server).
- :func:`parse_spec_meta` — one finished response's counters as a :class:`SpecRequestStats`,
  ``None`` when the server does not speculate (never zeros that look like measurements).
- :func:`summarize` / :func:`summarize_by` — mean accept length over verify steps and acceptance
  per draft position, for the whole run or per caller-chosen slice key.
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from eagle3_datagen.errors import ServerError

# The SGLang release whose field names and formulas this module follows.
KNOWN_VERSION = "0.5.23"

# meta_info fields SGLang 0.5.23 adds to a finished request that had at least one verify step
# (tokenizer_manager.py, _calculate_spec_decoding_metrics), in the order it adds them.
META_FIELDS = (
    "spec_accept_rate",
    "spec_accept_length",
    "spec_num_correct_drafts",
    "spec_num_proposed_drafts",
    "spec_verify_ct",
    "spec_correct_drafts_histogram",
)
# Names older SGLang releases used for the same counters: seeing one means "older server".
_OLDER_NAMES = ("spec_accept_token_num", "spec_draft_token_num", "spec_accept_histogram")
# Environment variables that replace real verification by a forced accept length.
SIMULATE_ENV = ("SGLANG_SIMULATE_ACC_LEN", "SGL_SIMULATE_ACC_LEN")
# SGLang treats a temperature below this as greedy (sampling_params.py).
_GREEDY_BELOW = 1e-6
# Request penalties SGLang's verify applies as of the step's start, not per accepted token.
_PENALTY_DEFAULTS = {"frequency_penalty": 0.0, "presence_penalty": 0.0, "repetition_penalty": 1.0}


def _server_field(info: Mapping[str, Any], name: str, version: str) -> Any:
    if name not in info:
        raise ServerError(
            f"/server_info of SGLang {version} has no {name!r}; this reader knows the fields of "
            f"SGLang {KNOWN_VERSION} (docs/sglang-speculative.md)"
        )
    return info[name]


def _optional_int(value: Any) -> int | None:
    return None if value is None else int(value)


@dataclass(frozen=True, slots=True)
class SpeculativeSettings:
    """The server's speculative decoding settings, as ``/server_info`` reports them at startup.

    ``/set_internal_state`` can change the two accept thresholds later without ``/server_info``
    showing it (docs/sglang-speculative.md): a check at startup is all the server allows.
    """

    version: str
    algorithm: str | None
    draft_model_path: str | None
    num_steps: int | None
    eagle_topk: int | None
    num_draft_tokens: int | None
    accept_threshold_single: float
    accept_threshold_acc: float
    use_rejection_sampling: bool
    adaptive: bool

    @classmethod
    def from_server_info(cls, info: Mapping[str, Any]) -> SpeculativeSettings:
        """Read the flat ``speculative_*`` fields; a missing one is an error naming it."""
        version = str(info.get("version") or "unknown")

        def get(name: str) -> Any:
            return _server_field(info, name, version)

        return cls(
            version=version,
            algorithm=get("speculative_algorithm"),
            draft_model_path=get("speculative_draft_model_path"),
            num_steps=_optional_int(get("speculative_num_steps")),
            eagle_topk=_optional_int(get("speculative_eagle_topk")),
            num_draft_tokens=_optional_int(get("speculative_num_draft_tokens")),
            accept_threshold_single=float(get("speculative_accept_threshold_single")),
            accept_threshold_acc=float(get("speculative_accept_threshold_acc")),
            use_rejection_sampling=bool(info.get("speculative_use_rejection_sampling", False)),
            adaptive=bool(info.get("speculative_adaptive", False)),
        )

    @property
    def is_speculating(self) -> bool:
        return self.algorithm is not None


def _simulated_acceptance(env: Mapping[str, str]) -> str | None:
    """The effective simulated accept length setting, if it is on (a float > 0).

    SGLang rewrites the legacy ``SGL_`` prefix to ``SGLANG_`` at start, so ``SGL_`` wins.
    """
    for name in reversed(SIMULATE_ENV):
        if name in env:
            try:
                on = float(env[name]) > 0
            except ValueError:
                return None  # SGLang warns and falls back to its default, -1 (off)
            return f"{name}={env[name]}" if on else None
    return None


def _exposed_env(info: Mapping[str, Any]) -> dict[str, str]:
    """Env vars the server shows in ``internal_states`` (only with SGLANG_EXPOSE_OWN_ENV_VARS)."""
    found: dict[str, str] = {}
    for state in info.get("internal_states") or ():
        if isinstance(state, Mapping) and isinstance(state.get("env_vars"), Mapping):
            found.update({str(k): str(v) for k, v in state["env_vars"].items()})
    return found


def _request_reasons(sampling: Mapping[str, Any]) -> list[str]:
    reasons = []
    if float(sampling.get("min_p") or 0.0) > 0:
        reasons.append(
            "min_p > 0: SGLang's speculative verify applies top_k and top_p only, so min_p is "
            "silently ignored"
        )
    for name, default in _PENALTY_DEFAULTS.items():
        value = sampling.get(name)
        if value is not None and float(value) != default:
            reasons.append(
                f"{name}={value}: speculative verify applies penalties as of the step's start "
                "to every drafted position (SGLang calls it a relaxed version)"
            )
    return reasons


def lossy_reasons(
    info: Mapping[str, Any],
    env: Mapping[str, str] | None = None,
    sampling: Mapping[str, Any] | None = None,
) -> list[str]:
    """Why a speculating server's tokens are not the target model's own distribution; empty
    when they are (or the server does not speculate).

    ``env`` is the server's environment where we know it (a server we launch); ``sampling``
    the request sampling parameters, for the knobs that are lossy per request.
    """
    settings = SpeculativeSettings.from_server_info(info)
    if not settings.is_speculating:
        return []
    reasons = []
    if settings.accept_threshold_single < 1.0:
        reasons.append(
            f"speculative_accept_threshold_single={settings.accept_threshold_single} < 1.0: "
            "a draft token is accepted whenever its target probability reaches it"
        )
    if settings.accept_threshold_acc < 1.0:
        reasons.append(
            f"speculative_accept_threshold_acc={settings.accept_threshold_acc} < 1.0: a draft "
            "token's accept probability p is raised to min(1, p / threshold)"
        )
    simulated = _simulated_acceptance({**_exposed_env(info), **(env or {})})
    if simulated:
        reasons.append(f"{simulated}: accept lengths are forced to a simulated value, not verified")
    device = info.get("device")
    greedy = sampling is not None and float(sampling.get("temperature", 1.0)) < _GREEDY_BELOW
    if device in ("cpu", "xpu") and not greedy:
        reasons.append(
            f"device={device}: SGLang's speculative verify commits the target's argmax there "
            "whatever the temperature"
        )
    if sampling is not None:
        reasons.extend(_request_reasons(sampling))
    return reasons


@dataclass(frozen=True, slots=True)
class SpecRequestStats:
    """One finished request's speculative counters (SGLang 0.5.23 ``meta_info``).

    ``accept_length`` and ``accept_rate`` are the server's own per-request figures, ``None``
    when it had no verify step (SGLang then reports no spec field at all).
    """

    verify_ct: int
    num_correct_drafts: int
    num_proposed_drafts: int
    completion_tokens: int
    correct_drafts_histogram: tuple[int, ...]
    accept_length: float | None = None
    accept_rate: float | None = None


def _missing(meta: Mapping[str, Any], names: Sequence[str], settings: SpeculativeSettings) -> str:
    older = [n for n in _OLDER_NAMES if n in meta]
    hint = f" (it has {older}, the names of an older SGLang)" if older else ""
    return (
        f"/generate meta_info from SGLang {settings.version} running "
        f"{settings.algorithm} has no {', '.join(names)}{hint}; this reader knows the fields of "
        f"SGLang {KNOWN_VERSION} (docs/sglang-speculative.md)"
    )


def _check_consistent(stats: SpecRequestStats, settings: SpeculativeSettings) -> None:
    hist = stats.correct_drafts_histogram
    drafts = sum(i * n for i, n in enumerate(hist))
    if sum(hist) != stats.verify_ct or drafts != stats.num_correct_drafts:
        raise ServerError(
            f"/generate meta_info from SGLang {settings.version}: spec_correct_drafts_histogram "
            f"{list(hist)} counts {sum(hist)} verify steps and {drafts} correct drafts, but "
            f"spec_verify_ct is {stats.verify_ct} and spec_num_correct_drafts "
            f"{stats.num_correct_drafts}"
        )


def parse_spec_meta(
    meta: Mapping[str, Any], settings: SpeculativeSettings
) -> SpecRequestStats | None:
    """The speculative counters of one finished ``/generate`` item; ``None`` when the server
    does not speculate.

    SGLang adds no spec field to a request without a verify step: its one token (two after a
    retraction, ...) came from prefill. A request with more tokens than prefills but no field is
    a server this reader does not know: an error naming the fields and the version, not zeros.
    """
    if not settings.is_speculating:
        return None
    completion = int(meta.get("completion_tokens", 0))
    present = [n for n in META_FIELDS if n in meta]
    if not present:
        if completion <= 1 + int(meta.get("num_retractions") or 0):
            return SpecRequestStats(0, 0, 0, completion, ())
        raise ServerError(_missing(meta, ["spec_verify_ct", "spec_num_correct_drafts"], settings))
    needed = ("spec_verify_ct", "spec_num_correct_drafts", "spec_correct_drafts_histogram")
    if absent := [n for n in needed if n not in meta]:
        raise ServerError(_missing(meta, absent, settings))
    stats = SpecRequestStats(
        verify_ct=int(meta["spec_verify_ct"]),
        num_correct_drafts=int(meta["spec_num_correct_drafts"]),
        num_proposed_drafts=int(meta.get("spec_num_proposed_drafts") or 0),
        completion_tokens=completion,
        correct_drafts_histogram=tuple(int(n) for n in meta["spec_correct_drafts_histogram"]),
        accept_length=meta.get("spec_accept_length"),
        accept_rate=meta.get("spec_accept_rate"),
    )
    _check_consistent(stats, settings)
    return stats


@dataclass(frozen=True, slots=True)
class AcceptanceSummary:
    """Acceptance over a set of requests.

    ``accept_length`` is SGLang's server-wide formula (``avg_spec_accept_length``): tokens
    committed per verify step, accepted drafts plus the bonus token. ``tokens_per_verify`` is
    the per-request ``spec_accept_length`` formula pooled: completion tokens per verify step,
    so it also counts each request's prefill token and stops at the stop token.
    ``position_reached[j-1]`` is the share of verify steps whose draft position ``j`` was
    accepted; ``position_conditional[j-1]`` the same among steps that accepted ``j - 1``.
    """

    requests: int
    verify_ct: int
    num_correct_drafts: int
    num_proposed_drafts: int
    completion_tokens: int
    correct_drafts_histogram: tuple[int, ...]
    accept_length: float | None
    tokens_per_verify: float | None
    accept_rate: float | None
    position_reached: tuple[float, ...]
    position_conditional: tuple[float | None, ...]


def _positions(hist: Sequence[int]) -> tuple[tuple[float, ...], tuple[float | None, ...]]:
    steps = sum(hist)
    if steps == 0:
        return (), ()
    at_least = [sum(hist[j:]) for j in range(len(hist))]  # steps with >= j correct drafts
    reached = tuple(at_least[j] / steps for j in range(1, len(hist)))
    conditional = tuple(
        at_least[j] / at_least[j - 1] if at_least[j - 1] else None for j in range(1, len(hist))
    )
    return reached, conditional


def summarize(
    stats: Iterable[SpecRequestStats], num_positions: int | None = None
) -> AcceptanceSummary:
    """Pool requests: sums of the counters, then the ratios (never a mean of per-request ratios).

    ``num_positions`` (the server's ``speculative_num_steps``) pads the per-position figures to
    every draft position; SGLang's histograms stop at the longest accepted run.
    """
    items = list(stats)
    width = max((len(s.correct_drafts_histogram) for s in items), default=0)
    if num_positions is not None:
        width = max(width, num_positions + 1)
    hist = [0] * width
    for s in items:
        for i, n in enumerate(s.correct_drafts_histogram):
            hist[i] += n
    verify = sum(s.verify_ct for s in items)
    correct = sum(s.num_correct_drafts for s in items)
    proposed = sum(s.num_proposed_drafts for s in items)
    completion = sum(s.completion_tokens for s in items)
    reached, conditional = _positions(hist)
    return AcceptanceSummary(
        requests=len(items),
        verify_ct=verify,
        num_correct_drafts=correct,
        num_proposed_drafts=proposed,
        completion_tokens=completion,
        correct_drafts_histogram=tuple(hist),
        accept_length=(correct + verify) / verify if verify else None,
        tokens_per_verify=completion / verify if verify else None,
        accept_rate=correct / proposed if proposed else None,
        position_reached=reached,
        position_conditional=conditional,
    )


K = TypeVar("K", bound=Hashable)


def summarize_by(
    keyed: Iterable[tuple[K, SpecRequestStats]], num_positions: int | None = None
) -> dict[K, AcceptanceSummary]:
    """One summary per slice key (partition, turn index, tools yes/no, an output-length bucket:
    whatever tuple the caller builds), in the order the keys first appear."""
    groups: dict[K, list[SpecRequestStats]] = defaultdict(list)
    for key, stats in keyed:
        groups[key].append(stats)
    return {key: summarize(items, num_positions) for key, items in groups.items()}


def length_bucket(n: int, edges: Sequence[int]) -> str:
    """A readable label for ``n`` among ascending ``edges``: ``<128``, ``128-511``, ``>=2048``."""
    if not edges or list(edges) != sorted(set(edges)):
        raise ValueError(f"bucket edges must be ascending and distinct, got {list(edges)}")
    if n < edges[0]:
        return f"<{edges[0]}"
    for low, high in itertools.pairwise(edges):
        if n < high:
            return f"{low}-{high - 1}"
    return f">={edges[-1]}"


def server_accept_lengths(info: Mapping[str, Any]) -> list[float]:
    """``avg_spec_accept_length`` of each data-parallel rank that reports one.

    SGLang adds it to ``internal_states`` only once a rank has logged a decode interval (every
    ``decode_log_interval`` decode batches, 40 by default), and ``/flush_cache`` resets it.
    """
    return [
        float(state["avg_spec_accept_length"])
        for state in info.get("internal_states") or ()
        if isinstance(state, Mapping) and "avg_spec_accept_length" in state
    ]
