"""Prompts that repeat an earlier line's, exactly after normalisation or nearly (MinHash).

Why: a prompt that appears twice, or twice with a word changed, weighs twice in training and
tells the draft nothing new. Found while the input is scanned (``inputs/scan.py``), reported
with both line numbers, and kept or dropped by the partition's ``near_duplicates`` policy.

Memory is what decides the design, since a partition can hold a million prompts. Per line the
finder keeps an 8-byte hash of the normalised prompt (exact duplicates: sorted, like
:class:`~eagle3_datagen.inputs.prompts.DuplicateFinder`) and a 64-byte signature: the low 8
bits of each of 64 MinHash values, datasketch's (b-bit minwise hashing, Li and
Koenig 2010), about 72 MB at a million lines; the shingles and the MinHash are computed for
thousands of prompts at once (``inputs/shingles.py``). LSH bands are 8 of those bytes as one
uint64; lines that share a band are candidates, and a candidate is a near duplicate when its
estimated Jaccard similarity (of word 3-gram sets) reaches the threshold.
"""

from __future__ import annotations

import bisect
import hashlib
import unicodedata
from array import array
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from eagle3_datagen.inputs.shingles import NUM_PERM, minhash, shingle_hashes

BAND = 8  # signature bytes per LSH band: 8 bands of 8
_CHUNK = 4096  # lines whose MinHash is computed in one call, at most
_CHUNK_BYTES = 1 << 18  # and at most about this much text (numpy needs ~40 bytes per byte)


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
    return " ".join(unicodedata.normalize("NFKC", text).casefold().split())


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(
            str(p.get("text") or "") for p in content if isinstance(p, dict) and "text" in p
        )
    return ""


def _image_refs(messages: list[dict[str, Any]]) -> list[str]:
    """The references of a prompt's non-text parts (images), in order."""
    return [
        str(p.get("image_url") or p.get("image") or p.get("url") or "")
        for m in messages
        if isinstance(m.get("content"), list)
        for p in m["content"]
        if isinstance(p, dict) and p.get("type") not in (None, "text")
    ]


def prompt_texts(messages: list[dict[str, Any]], tools: Any) -> tuple[str, str]:
    """``(exact, near)``: everything that makes two prompts the same (roles, texts, image
    references, tools), and the text near duplicates are judged on: every message but the
    system prompt (a long shared system prompt would make unrelated questions look alike;
    tools are left out for the same reason) and the image references (one question about two
    images is two). Both normalised, each message once."""
    texts = [normalize(_content_text(m.get("content"))) for m in messages]
    refs = _image_refs(messages)
    roles = [str(m.get("role")) for m in messages]
    exact = "\n".join(f"{r}: {t}" for r, t in zip(roles, texts, strict=True))
    exact += f"\n{refs}\n{tools or ''}"
    near = "\n".join(t for r, t in zip(roles, texts, strict=True) if r != "system")
    if refs:
        near += "".join(
            f" image {hashlib.blake2b(r.encode(), digest_size=6).hexdigest()}" for r in refs
        )
    return exact, near


def _hash8(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little")


class NearDuplicateFinder:
    """Add every parsed line in order; :meth:`find` then says which repeat an earlier one."""

    def __init__(self, threshold: float = 0.9) -> None:
        self.threshold = threshold
        self._lines = array("Q")
        self._exact = array("Q")
        self._sigs: list[np.ndarray] = []  # (<= _CHUNK, NUM_PERM) uint8 each
        self._starts: list[int] = []  # the index of each one's first line
        self._pending: list[bytes] = []
        self._pending_bytes = 0
        self._found = False

    def __len__(self) -> int:
        return len(self._lines)

    def add(self, line: int, messages: list[dict[str, Any]], tools: Any) -> None:
        self._lines.append(line)
        exact, near = prompt_texts(messages, tools)
        self._exact.append(_hash8(exact))
        text = near.encode()
        self._pending.append(text)
        self._pending_bytes += len(text)
        if len(self._pending) == _CHUNK or self._pending_bytes >= _CHUNK_BYTES:
            self._flush()

    def _flush(self) -> None:
        if not self._pending:
            return
        hashes, owner = shingle_hashes(self._pending)
        sig = (minhash(hashes, owner, len(self._pending)) & np.uint64(0xFF)).astype(np.uint8)
        # No text: a signature no other line shares (its band keys are unique).
        base = len(self._lines) - len(self._pending)
        for i in np.flatnonzero(np.bincount(owner, minlength=len(self._pending)) == 0).tolist():
            digest = hashlib.blake2b(b"%d" % (base + i), digest_size=NUM_PERM).digest()
            sig[i] = np.frombuffer(digest, np.uint8)
        self._sigs.append(sig)
        self._starts.append(base)
        self._pending, self._pending_bytes = [], 0

    def _sig(self, index: int) -> np.ndarray:
        block = bisect.bisect_right(self._starts, index) - 1
        return self._sigs[block][index - self._starts[block]]

    def find(self, skip: Iterable[int] = ()) -> list[Similar]:
        """Every line that repeats an earlier one, by line; ``skip``: lines already known to
        repeat (a repeated id) are neither reported nor compared. Once per finder: the exact
        hashes are released before the near-duplicate search, whose peak they would raise."""
        if self._found:
            raise RuntimeError("NearDuplicateFinder.find() runs once: its hashes are released")
        self._found = True
        self._flush()
        skipped = set(skip)
        found = self._exact_duplicates(skipped)
        self._exact = array("Q")
        taken = skipped | {s.line for s in found}
        found += self._near_duplicates(taken)
        return sorted(found, key=lambda s: s.line)

    def _exact_duplicates(self, skip: set[int]) -> list[Similar]:
        hashes = np.frombuffer(self._exact, dtype=np.uint64)
        lines = self._lines
        return [
            Similar(lines[i], lines[first], "exact", 1.0)
            for i, first in repeats(hashes)
            if lines[i] not in skip
        ]

    def _near_duplicates(self, taken: set[int]) -> list[Similar]:
        """Lines sharing an LSH band with an earlier line, verified by their signatures; each
        reported against the earliest of the first few lines of the band it resembles."""
        best: dict[int, tuple[int, float]] = {}
        for band in range(NUM_PERM // BAND):
            cols = slice(band * BAND, (band + 1) * BAND)
            keys = np.empty(len(self._lines), dtype=np.uint64)  # filled block by block
            for start, s in zip(self._starts, self._sigs, strict=True):
                keys[start : start + len(s)] = s[:, cols].copy().view(np.uint64)[:, 0]
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


def repeats(hashes: np.ndarray) -> list[tuple[int, int]]:
    """``(index, first index with the same hash)`` for every index that repeats one.

    Working memory: about 17 bytes per hash at its peak (the sort order and the hashes in
    it), freed on return; Python objects only for the repeats."""
    if len(hashes) < 2:
        return []
    order = np.argsort(hashes, kind="stable")  # equal hashes: indexes ascend
    ordered = hashes[order]
    same = ordered[1:] == ordered[:-1]  # position k + 1 repeats position k
    del ordered
    rep = np.flatnonzero(same) + 1
    if not len(rep):
        return []
    starts = np.concatenate([[0], np.flatnonzero(~same) + 1])  # where each run begins
    run_start = starts[np.searchsorted(starts, rep, side="right") - 1]
    return list(zip(order[rep].tolist(), order[run_start].tolist(), strict=True))


_COMPARE = 4  # earlier lines of a band's run each line is compared with


def _runs(keys: np.ndarray) -> list[tuple[int, list[int]]]:
    """For each index whose band key an earlier index shares: the index and the first few
    indexes with that key (at most ``_COMPARE``: comparisons stay linear in a large run)."""
    firsts: dict[int, list[int]] = {}
    out: list[tuple[int, list[int]]] = []
    for i, first in repeats(keys):  # within a run, indexes ascend
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
