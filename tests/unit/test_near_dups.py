"""Repeated prompts found when the input is scanned: real files, their line numbers, the
policy's effect on batch identity, and the config's errors."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from eagle3_datagen.config import NearDuplicates, load_config
from eagle3_datagen.errors import ConfigError
from eagle3_datagen.inputs import shingles
from eagle3_datagen.inputs.near_dups import NearDuplicateFinder, normalize, similar_summary
from eagle3_datagen.inputs.scan import scan_input
from eagle3_datagen.inputs.shingles import minhash, shingle_hashes

_WORDS = [f"word{i}" for i in range(3000)]
_HAN = [chr(c) for c in range(0x4E00, 0x4E00 + 2000)]
SYSTEM = " ".join(random.Random(0).choices(_WORDS, k=400))  # every line shares it


def line(i: int, content: str, system: bool = False, **extra: Any) -> dict[str, Any]:
    messages = [{"role": "system", "content": SYSTEM}] if system else []
    messages.append({"role": "user", "content": content})
    return {"id": f"r{i}", "messages": messages, **extra}


def planted() -> tuple[list[dict[str, Any]], dict[int, tuple[int, str]]]:
    """Forty distinct prompts of 200 words, then planted repeats: ``{line: (first, kind)}``.
    One word changed in 200 leaves a Jaccard similarity of word 3-grams of 195/201."""
    rng = random.Random(7)
    rows = [line(i, " ".join(rng.choices(_WORDS, k=200)), system=True) for i in range(40)]
    base = [r["messages"][-1]["content"] for r in rows]
    near = base[4].split()
    near[100] = "changed"
    zh = "".join(rng.choices(_HAN, k=200))
    rows += [
        # line 41: line 3's prompt in other case and spacing, full-width digits (NFKC): exact
        line(41, "  " + base[2].upper().replace(" ", "   ").replace("1", "１"), system=True),
        line(42, " ".join(near), system=True),  # line 5 with one word changed: near
        {**rows[9], "id": "r9"},  # line 10's id again: a repeated id, not reported here
        line(44, zh),
        line(45, zh[:100] + "字" + zh[101:]),  # near (Chinese, by characters)
        line(46, base[6], tools=[{"type": "function", "function": {"name": "f"}}]),  # tools
    ]
    return rows, {41: (3, "exact"), 42: (5, "near"), 45: (44, "near")}


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    return path


def test_normalize_folds_case_width_and_space() -> None:
    assert normalize("  Hello\u3000WORLD\n\n１２ ") == "hello world 12"


def test_scan_reports_exact_and_near_repeats_with_their_lines(tmp_path: Path) -> None:
    rows, expected = planted()
    path = write_jsonl(tmp_path / "in.jsonl", rows)
    scan = scan_input("p", path, 16, NearDuplicates())
    found = {s.line: (s.first, s.kind) for s in scan.similar}
    # line 46 has tools and no system prompt: not line 7's prompt exactly, but its text is
    assert found == {**expected, 46: (7, "near")}
    assert scan.duplicates == {43: 10}  # the repeated id, reported (and rejected) as before
    assert (scan.info.exact_duplicates, scan.info.near_duplicates) == (1, 3)
    assert scan.info.near_duplicates_policy == "keep"
    near = next(s for s in scan.similar if s.line == 42)
    assert 0.8 <= near.similarity < 1.0
    summary = similar_summary("p", str(path), scan.similar, "keep")
    assert f"{path}:41 repeats line 3 (exact)" in summary and "kept" in summary


def test_a_second_find_is_refused_not_silently_empty() -> None:
    """find() releases the exact hashes; asked again it raises instead of finding nothing."""
    finder = NearDuplicateFinder()
    for line in (1, 2):
        finder.add(line, [{"role": "user", "content": "the same question"}], None)
    assert [(s.line, s.first, s.kind) for s in finder.find()] == [(2, 1, "exact")]
    with pytest.raises(RuntimeError, match="runs once"):
        finder.find()


def test_a_stricter_threshold_and_off(tmp_path: Path) -> None:
    rows, _ = planted()
    path = write_jsonl(tmp_path / "in.jsonl", rows)
    strict = scan_input("p", path, 16, NearDuplicates(threshold=0.99))
    assert {s.line for s in strict.similar} == {41, 46}  # exact, and equal text
    off = scan_input("p", path, 16, NearDuplicates(policy="off"))
    assert off.similar == [] and off.info.near_duplicates_policy == "off"


def test_drop_changes_only_the_keys_of_batches_it_drops_from(tmp_path: Path) -> None:
    rows, _ = planted()
    path = write_jsonl(tmp_path / "in.jsonl", rows)
    plain = scan_input("p", path, 16)
    keep = scan_input("p", path, 16, NearDuplicates(policy="keep"))
    drop = scan_input("p", path, 16, NearDuplicates(policy="drop"))
    # keep: the keys batches had before the policy existed (a rerun reuses them)
    assert [b.key for b in keep.batches] == [b.key for b in plain.batches]
    assert sorted(drop.dropped) == [41, 42, 45, 46]
    # lines 1-16 and 17-32 drop nothing; 33-46 does
    same = [a.key == b.key for a, b in zip(keep.batches, drop.batches, strict=True)]
    assert same == [True, True, False]


def test_parquet_rows_are_numbered_like_lines(tmp_path: Path) -> None:
    rows, expected = planted()
    path = tmp_path / "in.parquet"
    pq.write_table(
        pa.Table.from_pylist([{"id": r["id"], "messages": r["messages"]} for r in rows]), path
    )
    scan = scan_input("p", path, 16, NearDuplicates())
    assert {s.line: (s.first, s.kind) for s in scan.similar} == {**expected, 46: (7, "near")}


@pytest.mark.parametrize(
    ("policy", "needle"),
    [
        ("{policy: remove}", "near_duplicates.policy: Input should be 'keep', 'drop' or 'off'"),
        ("{threshold: 0.2}", "near_duplicates.threshold: Input should be greater than or equal"),
        ("{treshold: 0.9}", "near_duplicates.treshold: Extra inputs are not permitted"),
    ],
)
def test_policy_errors_name_file_and_line(tmp_path: Path, policy: str, needle: str) -> None:
    path = tmp_path / "cfg.yaml"
    path.write_text(
        "model: {path: /m}\npartitions:\n"
        "  - name: p1\n    input: in.jsonl\n    tier: SHORT\n"
        f"    near_duplicates: {policy}\n"
    )
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert f"{path}:6: partitions.0.{needle}" in str(info.value)


def test_signatures_are_datasketchs_minhash() -> None:
    """The many-at-once MinHash gives what datasketch.MinHash gives each prompt alone."""
    from datasketch import MinHash

    texts = ["one two three four five", " ".join(_WORDS * 6), "a b", "", "今天天气很好，我们去公园"]
    hashes, owner = shingle_hashes([t.encode() for t in texts])  # the 2nd spans two blocks
    together = minhash(hashes, owner, len(texts))
    for i, sig in enumerate(together):
        alone = MinHash(num_perm=64, seed=1, scheme="legacy", hashfunc=int)
        alone.update_batch(hashes[owner == i].tolist())
        assert sig.tolist() == alone.hashvalues.tolist()
    # five words: 3 shingles; two words: one; none: none; CJK by character, '，' one too
    assert np.bincount(owner, minlength=5).tolist() == [3, 18000 - 2, 1, 0, 10]


def test_a_batch_past_the_cached_powers_hashes_each_text_as_alone() -> None:
    """The word hash's powers are kept between batches and grown for a longer one: texts in a
    ~400 KB batch (past the 256 KB kept at first) get the shingles they get alone."""
    rng = random.Random(3)
    texts = [" ".join(rng.choices(_WORDS, k=n)).encode() for n in (5, 30000, 7, 40000, 2)]
    together, owner = shingle_hashes(texts)
    assert sum(len(t) for t in texts) > 1 << 18
    for i, text in enumerate(texts):
        shingles._POWERS.clear()  # alone: powers computed afresh, to exactly this text's length
        alone, _ = shingle_hashes([text])
        assert together[owner == i].tolist() == alone.tolist()


def test_words_are_cut_like_text() -> None:
    """The same words give the same shingles whatever surrounds them."""
    a, _ = shingle_hashes([b"alpha beta gamma"])
    b, owner = shingle_hashes([b"zz", b"(alpha)  beta\tgamma!", b"x y"])
    assert a.tolist() == b[owner == 1].tolist()
