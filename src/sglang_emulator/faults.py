"""Seeded fault injection for ``/generate``, reproducible for a given sequence of requests.

One uniform draw per eligible HTTP request picks at most one fault, in the fixed order
400, 500, 503, reset, hang, abort. Requests whose rid starts with ``HEALTH_CHECK`` (SGLang's own
health probe) or ``preflight`` (the pipeline's readiness gate) are exempt from every fault,
including ``--emu-crash-after`` counting, so readiness checks keep working while faults fire.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Literal

FaultKind = Literal["400", "500", "503", "reset", "hang", "abort"]
FAULT_ORDER: tuple[FaultKind, ...] = ("400", "500", "503", "reset", "hang", "abort")
EXEMPT_RID_PREFIXES = ("HEALTH_CHECK", "preflight")


def is_exempt(rid: object) -> bool:
    """True if every rid of the request starts with an exempt prefix."""
    if isinstance(rid, str):
        return rid.startswith(EXEMPT_RID_PREFIXES)
    if isinstance(rid, list) and rid:
        return all(isinstance(r, str) and r.startswith(EXEMPT_RID_PREFIXES) for r in rid)
    return False


@dataclass(frozen=True)
class FaultRates:
    """Probability of each fault per request; they must sum to at most 1."""

    r400: float = 0.0
    r500: float = 0.0
    r503: float = 0.0
    reset: float = 0.0
    hang: float = 0.0
    abort: float = 0.0

    def ordered(self) -> tuple[float, ...]:
        return (self.r400, self.r500, self.r503, self.reset, self.hang, self.abort)

    @property
    def any(self) -> bool:
        return any(r > 0 for r in self.ordered())


class FaultInjector:
    """Draws faults from one seeded stream; counts requests for ``--emu-crash-after``."""

    def __init__(self, rates: FaultRates, seed: int, crash_after: int = 0) -> None:
        total = sum(rates.ordered())
        if total > 1.0 + 1e-9:
            raise ValueError(f"fault rates sum to {total:.3f} > 1")
        self.rates = rates
        self.seed = seed
        self.crash_after = crash_after
        self.rng = random.Random(seed)
        self.counted = 0

    def count_and_check_crash(self) -> bool:
        """Count one eligible request; True if this is the one to crash on."""
        self.counted += 1
        return self.crash_after > 0 and self.counted == self.crash_after

    def draw(self) -> FaultKind | None:
        """The fault for the next eligible request, or None."""
        if not self.rates.any:
            return None
        u = self.rng.random()
        acc = 0.0
        for kind, rate in zip(FAULT_ORDER, self.rates.ordered(), strict=True):
            acc += rate
            if u < acc:
                return kind
        return None

    def abort_keep(self, digest: bytes, produced: int) -> int:
        """How many ids an injected abort keeps: seeded by the prompt, so it is reproducible."""
        if produced <= 1:
            return 0
        rng = random.Random(digest + self.seed.to_bytes(16, "little", signed=True))
        return rng.randrange(produced)
