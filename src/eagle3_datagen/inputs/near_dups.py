"""Prompts that repeat an earlier line's, exactly after normalisation or nearly (MinHash).

Why: a prompt that appears twice, or twice with a word changed, weighs twice in training and
tells the draft nothing new. Found while the input is scanned (``inputs/scan.py``), reported
with both line numbers, and kept or dropped by the partition's ``near_duplicates`` policy.

Memory is what decides the design, since a partition can hold a million prompts. Per line the
finder keeps an 8-byte hash of the normalised prompt (exact duplicates: sorted, like
:class:`~eagle3_datagen.inputs.prompts.DuplicateFinder`) and a 64-byte signature: the low 8
bits of each of 64 MinHash values computed by ``datasketch`` (b-bit minwise hashing, Li and
Koenig 2010), about 72 MB at a million lines. LSH bands are 8 of those bytes read as one
uint64; lines that share a band are candidates, and a candidate is a near duplicate when its
estimated Jaccard similarity (of word 3-gram sets) reaches the threshold.
"""

from __future__ import annotations

import hashlib
import re
import unicodedata
from array import array
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

NUM_PERM = 64
BAND = 8  # signature bytes per LSH band: 8 bands of 8
_CHUNK = 4096  # lines whose MinHash is computed in one call
_SPACE = re.compile(r"\s+")
# Words, and each CJK character on its own (those scripts put no spaces between words).
_WORD = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff]|\w+")


@dataclass(frozen=True, slots=True)
class Similar:
    """Line ``line`` repeats line ``first``: ``exact`` (after normalisation) or ``near``."""

    line: int
    first: int
    kind: str
    similarity: float

    def to_json(self, path: str) -> dict[str, Any]:
        return {
            "file": path,
            "line": self.line,
            "first_line": self.first,
            "kind": self.kind,
            "similarity": round(self.similarity, 3),
        }


def normalize(text: str) -> str:
    """NFKC, case folded, runs of whitespace as one space: what "the same prompt" ignores."""
    return _SPACE.sub(" ", unicodedata.normalize("NFKC", text).casefold()).strip()


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(
            str(p.get("text") or "") for p in content if isinstance(p, dict) and "text" in p
        )
    return ""


def exact_text(messages: list[dict[str, Any]], tools: Any) -> str:
    """Everything that makes two prompts the same: roles, texts, image references, tools."""
    parts = [f"{m.get('role')}: {_content_text(m.get('content'))}" for m in messages]
    images = [
        str(p.get("image_url") or p.get("image") or "")
        for m in messages
        if isinstance(m.get("content"), list)
        for p in m["content"]
        if isinstance(p, dict) and p.get("type") not in (None, "text")
    ]
    return normalize("\n".join(parts) + f"\n{images}\n{tools or ''}")


def near_text(messages: list[dict[str, Any]]) -> str:
    """The text near duplicates are judged on: every message but the system prompt (a long
    shared system prompt would make unrelated questions look alike), tools left out alike."""
    return normalize(
        "\n".join(_content_text(m.get("content")) for m in messages if m.get("role") != "system")
    )


def shingles(text: str) -> list[bytes]:
    """Word 3-grams of ``text`` (one shingle of its words when it has fewer)."""
    words = _WORD.findall(text)
    if len(words) < 3:
        return [" ".join(words).encode()] if words else []
    return [" ".join(words[i : i + 3]).encode() for i in range(len(words) - 2)]


def _hash8(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little")


class NearDuplicateFinder:
    """Add every parsed line in order; :meth:`find` then says which repeat an earlier one."""

    def __init__(self, threshold: float = 0.9) -> None:
        self.threshold = threshold
        self._lines = array("Q")
        self._exact = array("Q")
        self._sigs: list[np.ndarray] = []  # (<= _CHUNK, NUM_PERM) uint8 each
        self._pending: list[list[bytes]] = []

    def __len__(self) -> int:
        return len(self._lines)

    def add(self, line: int, messages: list[dict[str, Any]], tools: Any) -> None:
        self._lines.append(line)
        self._exact.append(_hash8(exact_text(messages, tools)))
        self._pending.append(shingles(near_text(messages)))
        if len(self._pending) == _CHUNK:
            self._flush()

    def _flush(self) -> None:
        from datasketch import MinHash

        if not self._pending:
            return
        sig = np.zeros((len(self._pending), NUM_PERM), dtype=np.uint8)
        texts = [(i, s) for i, s in enumerate(self._pending) if s]
        hashed = MinHash.bulk((s for _, s in texts), num_perm=NUM_PERM)
        for (i, _), m in zip(texts, hashed, strict=True):
            sig[i] = np.asarray(m.hashvalues, dtype=np.uint64) & 0xFF
        empty = [i for i, s in enumerate(self._pending) if not s]
        # No text: a signature no other line shares (its band keys are unique).
        base = len(self._sigs) * _CHUNK
        for i in empty:
            sig[i] = np.frombuffer(
                hashlib.blake2b(b"%d" % (base + i), digest_size=64).digest(), np.uint8
            )
        self._sigs.append(sig)
        self._pending = []

    def _sig(self, index: int) -> np.ndarray:
        return self._sigs[index // _CHUNK][index % _CHUNK]

    def find(self, skip: Iterable[int] = ()) -> list[Similar]:
        """Every line that repeats an earlier one, by line; ``skip``: lines already known to
        repeat (a repeated id) are neither reported nor compared."""
        self._flush()
        skipped = set(skip)
        found = self._exact_duplicates(skipped)
        taken = skipped | {s.line for s in found}
        found += self._near_duplicates(taken)
        return sorted(found, key=lambda s: s.line)

    def _exact_duplicates(self, skip: set[int]) -> list[Similar]:
        hashes = np.frombuffer(self._exact, dtype=np.uint64)
        lines = self._lines
        return [
            Similar(lines[i], lines[first], "exact", 1.0)
            for i, first in _repeats(hashes)
            if lines[i] not in skip
        ]

    def _near_duplicates(self, taken: set[int]) -> list[Similar]:
        """Lines sharing an LSH band with an earlier line, verified by their signatures; each
        reported against the earliest of the first few lines of the band it resembles."""
        best: dict[int, tuple[int, float]] = {}
        for band in range(NUM_PERM // BAND):
            cols = slice(band * BAND, (band + 1) * BAND)
            keys = np.concatenate([s[:, cols].copy().view(np.uint64)[:, 0] for s in self._sigs])
            for i, members in _runs(keys):
                if i in best:
                    continue
                for j in members:
                    sim = self.similarity(i, j)
                    if sim >= self.threshold:
                        best[i] = (j, sim)
                        break
        lines = self._lines
        return [
            Similar(lines[i], lines[j], "near", sim)
            for i, (j, sim) in best.items()
            if lines[i] not in taken
        ]

    def similarity(self, i: int, j: int) -> float:
        """Estimated Jaccard similarity of two added lines (by index) from their 8-bit MinHash
        values: a byte agrees with probability J + (1 - J) / 256."""
        agree = float(np.count_nonzero(self._sig(i) == self._sig(j))) / NUM_PERM
        return max(0.0, (agree - 1 / 256) / (1 - 1 / 256))


def _repeats(hashes: np.ndarray) -> list[tuple[int, int]]:
    """``(index, first index with the same hash)`` for every index that repeats one."""
    if len(hashes) < 2:
        return []
    order = np.argsort(hashes, kind="stable")  # equal hashes: indexes ascend
    ordered = hashes[order]
    new_run = np.concatenate([[True], ordered[1:] != ordered[:-1]])
    run_start = np.maximum.accumulate(np.where(new_run, np.arange(len(order)), 0))
    rep = np.flatnonzero(~new_run)
    return list(zip(order[rep].tolist(), order[run_start[rep]].tolist(), strict=True))


_COMPARE = 4  # earlier lines of a band's run each line is compared with


def _runs(keys: np.ndarray) -> list[tuple[int, list[int]]]:
    """For each index whose band key an earlier index shares: the index and the first few
    indexes with that key (at most ``_COMPARE``: comparisons stay linear in a large run)."""
    firsts: dict[int, list[int]] = {}
    out: list[tuple[int, list[int]]] = []
    for i, first in _repeats(keys):  # within a run, indexes ascend
        earlier = firsts.setdefault(first, [first])
        out.append((i, earlier[:]))
        if len(earlier) < _COMPARE:
            earlier.append(i)
    return out


def similar_summary(partition: str, path: str, similar: list[Similar], policy: str) -> str:
    """The log line of a scan that found repeated prompts: counts, the first few, the policy."""
    exact = sum(s.kind == "exact" for s in similar)
    shown = "; ".join(
        f"{path}:{s.line} repeats line {s.first} ({s.kind}"
        + (f", {s.similarity:.2f})" if s.kind == "near" else ")")
        for s in similar[:3]
    )
    more = f"; {len(similar) - 3} more" if len(similar) > 3 else ""
    done = "dropped (rejected)" if policy == "drop" else "kept (policy keep)"
    return (
        f"{partition}: {exact} exact and {len(similar) - exact} near duplicate prompts, "
        f"{done}: {shown}{more}; all in {partition}/near_duplicates.jsonl"
    )
