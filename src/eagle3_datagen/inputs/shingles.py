"""Word 3-gram shingles of many texts, and their MinHash, in a few numpy passes.

Why numpy over bytes: the input scan shingles every prompt of a partition (a million of them),
and hashing word by word in Python costs about half a microsecond a word, minutes for long
prompts. Here the texts of a batch are joined into one byte string and cut into words, hashed
(a polynomial hash over each word's bytes, from prefix sums) and shingled with array
operations. A word is a run of ASCII letters, digits and ``_`` and of non-ASCII characters,
except that each CJK, kana or hangul character (three UTF-8 bytes from U+3000 to U+DFFF) is a
word of its own, since those scripts put no spaces between words.

The MinHash is datasketch's (its permutations and "legacy" formula, checked against
``datasketch.MinHash`` by a test), for thousands of texts at once instead of one object each;
datasketch itself is a test dependency only.
"""

from __future__ import annotations

import functools

import numpy as np

NUM_PERM = 64
_BLOCK = 1 << 12  # shingles permuted at once: 4k x 64 x 8 bytes = 2 MB per array
_PRIME = np.uint64((1 << 61) - 1)  # datasketch's Mersenne prime
MAX_HASH = np.uint64((1 << 32) - 1)  # also the value of a MinHash that saw nothing
_P = 0x100000001B3  # the polynomial hash's base: odd, so invertible modulo 2**64
_P_INV = pow(_P, -1, 1 << 64)
_MIX = (
    np.uint64(0x9E3779B97F4A7C15),
    np.uint64(0xC2B2AE3D27D4EB4F),
    np.uint64(0x165667B19E3779F9),
)
_WORD_BYTE = np.zeros(256, dtype=bool)
for _chars in (b"0123456789_", b"ABCDEFGHIJKLMNOPQRSTUVWXYZ", b"abcdefghijklmnopqrstuvwxyz"):
    _WORD_BYTE[list(_chars)] = True
_WORD_BYTE[0x80:] = True
_EMPTY = np.empty(0, dtype=np.uint64)


_POWERS: dict[int, np.ndarray] = {}  # base -> its powers so far (grown, never shrunk)


def _powers(base: int, n: int) -> np.ndarray:
    """``base ** k`` modulo 2**64 for k in 0..n-1 (numpy's uint64 products wrap); kept
    between batches, since every batch needs the same ones (a batch is at most ~256 KB)."""
    have = _POWERS.get(base)
    if have is None or len(have) < n:
        out = np.full(max(n, 1 << 18), base, dtype=np.uint64)
        out[0] = 1
        have = _POWERS[base] = np.cumprod(out, dtype=np.uint64)
    return have[:n]


def _mod_prime(x: np.ndarray) -> np.ndarray:
    """``x % (2**61 - 1)`` for uint64 ``x``, in place, without a division: 2**61 is 1 modulo
    the prime, so x = hi * 2**61 + lo is hi + lo, at most one prime too large."""
    hi = x >> np.uint64(61)
    x &= _PRIME
    x += hi
    np.subtract(x, _PRIME, out=x, where=x >= _PRIME)
    return x


def _words(b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each word's first byte and the byte after its last."""
    n = len(b)
    word = _WORD_BYTE[b]
    lead = (b >= 0xE3) & (b <= 0xED)  # a 3-byte character from U+3000 to U+DFFF
    new = word & ~np.concatenate([[False], word[:-1]])
    new |= lead
    after = np.flatnonzero(lead) + 3
    after = after[after < n]
    new[after] |= word[after]
    starts = np.flatnonzero(new)
    bounds = np.append(np.flatnonzero(~word | new), n)
    ends = bounds[np.searchsorted(bounds, starts, side="right")]
    return starts, ends


def shingle_hashes(texts: list[bytes]) -> tuple[np.ndarray, np.ndarray]:
    """The 32-bit hashes (as uint64) of every text's word 3-grams, and the index of the text
    each belongs to, grouped by text in order; a text of one or two words has one shingle,
    a text without words none."""
    buf = b"\x00".join(texts)  # NUL is no word byte: no word spans two texts
    if not buf:
        return _EMPTY, _EMPTY
    b = np.frombuffer(buf, dtype=np.uint8)
    starts, ends = _words(b)
    if not len(starts):
        return _EMPTY, _EMPTY
    prefix = np.zeros(len(b) + 1, dtype=np.uint64)
    np.cumsum(b.astype(np.uint64) * _powers(_P, len(b)), dtype=np.uint64, out=prefix[1:])
    h = (prefix[ends] - prefix[starts]) * _powers(_P_INV, len(b))[starts]
    w = (h * _MIX[0]) >> np.uint64(32)
    offsets = np.cumsum([0] + [len(t) + 1 for t in texts[:-1]])
    owner = np.searchsorted(offsets, starts, side="right") - 1
    counts = np.bincount(owner, minlength=len(texts))
    w = np.concatenate([w, np.zeros(2, np.uint64)])  # the missing words of short texts
    full = np.flatnonzero(owner[2:] == owner[:-2]) if len(owner) > 2 else np.empty(0, np.int64)
    short = np.searchsorted(owner, np.flatnonzero((counts > 0) & (counts < 3)))
    pad = np.where(counts[owner[short]] == 2, w[short + 1], 0).astype(np.uint64)
    first = np.concatenate([w[full], w[short]])
    second = np.concatenate([w[full + 1], pad])
    third = np.concatenate([w[full + 2], np.zeros(len(short), np.uint64)])
    mixed = ((first * _MIX[0]) ^ (second * _MIX[1]) ^ (third * _MIX[2])) >> np.uint64(32)
    rows = np.concatenate([owner[full], owner[short]])
    order = np.argsort(rows, kind="stable")
    return mixed[order], rows[order]


@functools.cache
def permutations() -> tuple[np.ndarray, np.ndarray]:
    """datasketch's MinHash permutations (seed 1, its "legacy" scheme), drawn as its
    ``MinHash._init_permutations`` draws them. Not imported from it: ``import datasketch``
    pulls in scipy, ~1 s of CPU and ~60 MB of memory in every run for 128 numbers."""
    gen = np.random.RandomState(1)
    pairs = [
        (gen.randint(1, _PRIME, dtype=np.uint64), gen.randint(0, _PRIME, dtype=np.uint64))
        for _ in range(NUM_PERM)
    ]
    a, b = np.array(pairs, dtype=np.uint64).T
    return a, b


def minhash(hashes: np.ndarray, owner: np.ndarray, count: int) -> np.ndarray:
    """The 64 MinHash values of each of ``count`` texts from their shingles' hashes (grouped
    by ``owner``), ``(count, 64)`` uint64: what ``datasketch.MinHash(num_perm=64,
    scheme="legacy").update_batch`` gives each; a text without shingles keeps MAX_HASH.

    Permutation-major (64 rows of shingles): each text's minimum is then a reduction over
    contiguous memory, several times faster than over a column of shingle-major rows."""
    a, b = (p[:, None] for p in permutations())
    sig = np.full((NUM_PERM, count), MAX_HASH, dtype=np.uint64)
    for s0 in range(0, len(hashes), _BLOCK):
        hv, rows = hashes[None, s0 : s0 + _BLOCK], owner[s0 : s0 + _BLOCK]
        phv = hv * a
        phv += b
        _mod_prime(phv)
        phv &= MAX_HASH
        starts = np.flatnonzero(np.concatenate([[True], rows[1:] != rows[:-1]]))
        firsts = rows[starts]
        sig[:, firsts] = np.minimum(sig[:, firsts], np.minimum.reduceat(phv, starts, axis=1))
    return np.ascontiguousarray(sig.T)
