"""Reading a Prometheus text exposition as its families: what two expositions must share to be
the same server's (``/metrics`` of SGLang, its recording, the emulator)."""

from __future__ import annotations

import re
from pathlib import Path

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
SGLANG = FIXTURES / "sglang-0.5.23" / "metrics.txt"
ROUTER = FIXTURES / "sglang-router" / "metrics.txt"
_SUFFIXES = ("_bucket", "_sum", "_count", "_total", "_created")


def families(text: str) -> dict[str, tuple[str, frozenset[str]]]:
    """Per metric family: its type and the label names of its samples (``le``, ``quantile``
    and multiprocess ``pid`` aside)."""
    types: dict[str, str] = {}
    labels: dict[str, set[str]] = {}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split()
            types[name] = kind
            labels.setdefault(name, set())
        elif line and not line.startswith("#"):
            sample, _, rest = line.partition("{")
            names = {p.split("=")[0] for p in rest.rpartition("}")[0].split('",') if "=" in p}
            candidates = (sample, *(sample.removesuffix(s) for s in _SUFFIXES))
            family = next((f for f in candidates if f in types), sample)
            labels.setdefault(family, set()).update(names - {"le", "quantile", "pid"})
    return {n: (types.get(n, "untyped"), frozenset(labels.get(n, ()))) for n in types}


def buckets(text: str) -> dict[str, tuple[float, ...]]:
    """Per histogram: the bounds (``le``) of its buckets."""
    out: dict[str, set[float]] = {}
    for m in re.finditer(r'^(\S+)_bucket\{[^}]*le="([^"]+)"', text, re.MULTILINE):
        out.setdefault(m[1], set()).add(float(m[2]))
    return {name: tuple(sorted(b)) for name, b in out.items()}


def helps(text: str) -> dict[str, str]:
    """Per family: its HELP text."""
    return {
        line.split(" ", 3)[2]: line.split(" ", 3)[3] if line.count(" ") >= 3 else ""
        for line in text.splitlines()
        if line.startswith("# HELP ")
    }
