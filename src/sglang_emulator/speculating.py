"""The emulator as a speculating server: SGLang 0.5.23's ``--speculative-*`` flags resolved as
SGLang resolves them, the spec fields of each finished request's ``meta_info``, and the
server-wide ``avg_spec_accept_length`` of ``/server_info``.

Why a module of its own: the fake model draws each verify step's accepted drafts from an
:class:`~sglang_emulator.speculation.AcceptanceProfile`, but a backend with a real draft counts
them itself. Both hand a request's :class:`~sglang_emulator.speculation.SpecCounters` to
:meth:`Speculator.finish`, which returns the ``meta_info`` fields by SGLang's formulas and folds
the request into the server-wide figure (docs/sglang-speculative.md).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sglang_emulator.speculation import (
    AVG_ACCEPT_LENGTH_KEY,
    AcceptanceProfile,
    ServerAcceptance,
    SpecCounters,
    simulate_request,
)

# The algorithms whose per-request counters the emulator models (EAGLE family; NEXTN is
# reported as EAGLE, speculative_hook.py ``_resolve_speculative_algorithm_alias``).
EAGLE_FAMILY = ("EAGLE", "EAGLE3", "STANDALONE")
_ALIASES = {"NEXTN": "EAGLE"}
# ``_auto_choose_speculative_params``: (steps, topk, draft tokens) when --speculative-num-steps
# is unset; (5, 4, 8) for these architectures, (3, 1, 4) for every other one and STANDALONE.
_WIDE_AUTO_ARCHS = ("LlamaForCausalLM", "Grok1ForCausalLM", "Grok1VForCausalLM")
# Per-position acceptance when the command line gives no profile.
DEFAULT_POSITION_PROB = 0.7
# SGLang's default under EAGLE-family speculation when --max-running-requests is unset.
SPEC_MAX_RUNNING_REQUESTS = 48


class SpeculationArgsError(ValueError):
    """A ``--speculative-*`` or ``--emu-accept-*`` value the emulator cannot serve."""


@dataclass(frozen=True, slots=True)
class SpecSettings:
    """The resolved speculative settings, as ``/server_info`` reports them."""

    algorithm: str
    draft_model_path: str
    num_steps: int
    eagle_topk: int
    num_draft_tokens: int

    def server_fields(self) -> dict[str, Any]:
        return {
            "speculative_algorithm": self.algorithm,
            "speculative_draft_model_path": self.draft_model_path,
            "speculative_draft_model_revision": "main",
            "speculative_num_steps": self.num_steps,
            "speculative_eagle_topk": self.eagle_topk,
            "speculative_num_draft_tokens": self.num_draft_tokens,
        }


def _algorithm(raw: str) -> str:
    name = raw.upper()
    name = _ALIASES.get(name, name)
    if name not in EAGLE_FAMILY:
        raise SpeculationArgsError(
            f"--speculative-algorithm {raw}: the emulator speculates as "
            f"{', '.join(EAGLE_FAMILY)} (or NEXTN) only"
        )
    return name


def _readable_dir(path: str) -> str:
    """SGLang loads the draft from this path; the emulator, with no weights to load, asks only
    that it be a readable directory (anything else would fail SGLang's load too)."""
    p = Path(path).expanduser()
    if not p.is_dir() or not os.access(p, os.R_OK | os.X_OK):
        raise SpeculationArgsError(
            f"--speculative-draft-model-path {path}: not a readable directory"
        )
    return path


def resolve_settings(ns: Any, architecture: str) -> SpecSettings | None:
    """``--speculative-*`` resolved as SGLang 0.5.23's ``_handle_eagle_family``: upper-cased
    algorithm, automatic (steps, topk, draft tokens) when ``--speculative-num-steps`` is unset,
    draft tokens forced to ``steps + 1`` under topk 1. ``None`` when not speculating."""
    if ns.speculative_algorithm is None:
        return None
    algorithm = _algorithm(ns.speculative_algorithm)
    if ns.speculative_draft_model_path is None:
        raise SpeculationArgsError(f"--speculative-algorithm {algorithm} needs a draft model path")
    draft = _readable_dir(ns.speculative_draft_model_path)
    steps, topk = ns.speculative_num_steps, ns.speculative_eagle_topk
    tokens = ns.speculative_num_draft_tokens
    if steps is None:
        if topk is not None or tokens is not None:
            raise SpeculationArgsError(
                "--speculative-eagle-topk/--speculative-num-draft-tokens need "
                "--speculative-num-steps (SGLang chooses all three or none)"
            )
        wide = algorithm != "STANDALONE" and architecture in _WIDE_AUTO_ARCHS
        steps, topk, tokens = (5, 4, 8) if wide else (3, 1, 4)
    if topk is None:
        raise SpeculationArgsError("--speculative-num-steps needs --speculative-eagle-topk")
    if steps < 1 or topk < 1:
        raise SpeculationArgsError(
            "--speculative-num-steps and --speculative-eagle-topk must be >= 1"
        )
    if topk == 1 or tokens is None:
        tokens = steps + 1
    return SpecSettings(algorithm, draft, int(steps), int(topk), int(tokens))


def parse_profile(
    accept_length: float | None, accept_probs: str | None, num_steps: int
) -> AcceptanceProfile:
    """The ``--emu-accept-length`` / ``--emu-accept-probs`` profile (at most one of them)."""
    if accept_length is not None and accept_probs is not None:
        raise SpeculationArgsError("give --emu-accept-length or --emu-accept-probs, not both")
    try:
        if accept_length is not None:
            return AcceptanceProfile.for_mean_accept_length(accept_length, num_steps)
        if accept_probs is not None:
            probs = tuple(float(p) for p in accept_probs.split(",") if p.strip())
            return AcceptanceProfile(probs)
    except ValueError as err:
        raise SpeculationArgsError(f"--emu-accept-*: {err}") from None
    return AcceptanceProfile((DEFAULT_POSITION_PROB,))


class Speculator:
    """A speculating server's bookkeeping: settings, profile, the server-wide average."""

    def __init__(self, settings: SpecSettings, profile: AcceptanceProfile) -> None:
        self.settings = settings
        self.profile = profile
        self.server = ServerAcceptance()

    def finish(self, counters: SpecCounters) -> dict[str, Any]:
        """A finished request: its ``meta_info`` spec fields (SGLang's formulas; none without
        a verify step), counted into the server-wide average. For any backend's counters."""
        self.server.record(counters)
        return counters.meta_info(self.settings.num_draft_tokens)

    def simulate(self, num_output_tokens: int, seed: int, retractions: int = 0) -> dict[str, Any]:
        """The fake model's request: counters drawn from the profile, then :meth:`finish`."""
        counters = simulate_request(
            num_output_tokens, self.profile, self.settings.num_steps, seed, retractions
        )
        return self.finish(counters)

    def internal_state(self) -> dict[str, Any]:
        """What a rank's ``internal_states`` entry adds: the average, once there is one."""
        average = self.server.average()
        return {} if average is None else {AVG_ACCEPT_LENGTH_KEY: average}


def request_seed(digest: bytes, seed: int) -> int:
    """One request's acceptance seed: its prompt and its sampling seed decide it."""
    return int.from_bytes(digest[:8], "little") ^ (seed & 0xFFFFFFFFFFFFFFFF)
