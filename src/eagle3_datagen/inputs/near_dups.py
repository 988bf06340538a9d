"""Prompts that repeat an earlier line's, exactly after normalisation or nearly (MinHash).

Why: a prompt that appears twice, or twice with a word changed, weighs twice in training and
tells the draft nothing new. Found while the input is scanned (``inputs/scan.py``), reported
with both line numbers, and kept or dropped by the partition's ``near_duplicates`` policy.

Memory is what decides the design, since a partition can hold a million prompts. Per line the
finder keeps an 8-byte hash of the normalised prompt (exact duplicates: sorted, like
:class:`~eagle3_datagen.inputs.prompts.DuplicateFinder`) and a 64-byte signature: the low 8
bits of each of 64 MinHash values computed by ``datasketch`` (b-bit minwise hashing, Li and
Koenig 2010), about 72 MB at a million lines. The MinHash is datasketch's (its permutations
and formula, checked against ``datasketch.MinHash`` by a test), computed for thousands of
prompts in one numpy pass instead of one object per prompt. LSH bands are 8 of those bytes as one
uint64; lines that share a band are candidates, and a candidate is a near duplicate when its
estimated Jaccard similarity (of word 3-gram sets) reaches the threshold.
"""

from __future__ import annotations

import functools
import hashlib
import re
import unicodedata
import zlib
from array import array
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

NUM_PERM = 64
BAND = 8  # signature bytes per LSH band: 8 bands of 8
_CHUNK = 4096  # lines whose MinHash is computed in one call
_BLOCK = 1 << 14  # shingles permuted at once: 16k x 64 x 8 bytes = 8 MB per array
_PRIME = np.uint64((1 << 61) - 1)  # datasketch's Mersenne prime
_MAX_HASH = np.uint64((1 << 32) - 1)
_MIX = (np.uint64(0x9E3779B97F4A7C15), np.uint64(0xC2B2AE3D27D4EB4F), np.uint64(0x165667B19E3779F9))
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


def shingles(text: str) -> np.ndarray:
    """32-bit hashes of the word 3-grams of ``text`` (one of its words when it has fewer than
    three), as uint64: words hashed with CRC-32 (deterministic in every process, unlike
    ``hash``), then three mixed into one."""
    words = _WORD.findall(text)
    if not words:
        return np.empty(0, dtype=np.uint64)
    w = np.fromiter((zlib.crc32(x.encode()) for x in words), np.uint64, len(words))
    if len(w) < 3:
        w = np.concatenate([w, np.zeros(3 - len(w), np.uint64)])
    mixed = (w[:-2] * _MIX[0]) ^ (w[1:-1] * _MIX[1]) ^ (w[2:] * _MIX[2])  # wraps mod 2**64
    return mixed >> np.uint64(32)


@functools.cache
def permutations() -> tuple[np.ndarray, np.ndarray]:
    """datasketch's MinHash permutations (seed 1, its "legacy" scheme): the signature is
    the one ``datasketch.MinHash(num_perm=64, scheme="legacy")`` gives the same hashes."""
    from datasketch import MinHash

    a, b = MinHash(num_perm=NUM_PERM, seed=1, scheme="legacy").permutations
    return np.asarray(a, np.uint64), np.asarray(b, np.uint64)


def minhash(docs: list[np.ndarray]) -> np.ndarray:
    """The 64 MinHash values of each of ``docs`` (shingle hashes), ``(len(docs), 64)`` uint64,
    computed for many documents at once, ``_BLOCK`` shingles at a time (bounded memory); a
    document without shingles keeps the empty value 2**32 - 1 everywhere."""
    a, b = permutations()
    sig = np.full((len(docs), NUM_PERM), _MAX_HASH, dtype=np.uint64)
    lengths = np.fromiter((len(d) for d in docs), np.int64, len(docs))
    if not lengths.sum():
        return sig
    flat = np.concatenate(docs)
    owner = np.repeat(np.arange(len(docs)), lengths)
    for s0 in range(0, len(flat), _BLOCK):
        hv, rows = flat[s0 : s0 + _BLOCK, None], owner[s0 : s0 + _BLOCK]
        phv = ((hv * a + b) % _PRIME) & _MAX_HASH
        starts = np.flatnonzero(np.concatenate([[True], rows[1:] != rows[:-1]]))
        firsts = rows[starts]
        sig[firsts] = np.minimum(sig[firsts], np.minimum.reduceat(phv, starts, axis=0))
    return sig


def _hash8(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little")


class NearDuplicateFinder:
    """Add every parsed line in order; :meth:`find` then says which repeat an earlier one."""

    def __init__(self, threshold: float = 0.9) -> None:
        self.threshold = threshold
        self._lines = array("Q")
        self._exact = array("Q")
        self._sigs: list[np.ndarray] = []  # (<= _CHUNK, NUM_PERM) uint8 each
        self._pending: list[np.ndarray] = []

    def __len__(self) -> int:
        return len(self._lines)

    def add(self, line: int, messages: list[dict[str, Any]], tools: Any) -> None:
        self._lines.append(line)
        exact, near = prompt_texts(messages, tools)
        self._exact.append(_hash8(exact))
        self._pending.append(shingles(near))
        if len(self._pending) == _CHUNK:
            self._flush()

    def _flush(self) -> None:
        if not self._pending:
            return
        sig = (minhash(self._pending) & np.uint64(0xFF)).astype(np.uint8)
        # No text: a signature no other line shares (its band keys are unique).
        base = len(self._sigs) * _CHUNK
        for i in (i for i, d in enumerate(self._pending) if not len(d)):
            digest = hashlib.blake2b(b"%d" % (base + i), digest_size=NUM_PERM).digest()
            sig[i] = np.frombuffer(digest, np.uint8)
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
