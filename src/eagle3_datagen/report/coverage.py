"""A finished dataset's mix against the traffic its draft will serve (the ``serving_profile``).

Why: a draft accepts less where its training data is thin, so the mix of the data (modes, tools,
tool results, images, user turns, input and output lengths, languages) is set beside the
traffic the config declares, and every dimension off by more than the tolerance, or declared
but absent, is flagged. Without a profile the data's own mix is shown. Each record is one
request the draft would serve, so shares are of records. The table goes to ``eagle3-datagen
coverage``, the dataset card and the run's Prefect artifact (docs/coverage.md).

Languages are estimated by Unicode script, not by a language detector: a sample of prompts is
decoded with the dataset's own tokenizer and each is named by its dominant non-Latin script
(the chat template and tool schemas put Latin letters in every prompt; see :func:`script_of`).
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.compute as pc
import pyarrow.parquet as pq

from eagle3_datagen.config import ServingProfile, parse_bucket
from eagle3_datagen.errors import DatagenError, DatasetError
from eagle3_datagen.write.dataset_dir import DatasetDir

# The dimensions, in the order shown: (name, header). Names are the profile's keys.
DIMENSIONS = (
    ("modes", "mode"),
    ("tools", "with tools"),
    ("tool_results", "tool results in history"),
    ("images", "with images"),
    ("turns", "user turns"),
    ("input_tokens", "input tokens"),
    ("output_tokens", "output tokens"),
    ("languages", "language (script)"),
)
BINARY = ("tools", "tool_results", "images")
# Buckets of the data's own mix, where the profile declares none.
DEFAULT_BUCKETS = {
    "turns": ("1", "2", "3-4", "5-8", ">=9"),
    "input_tokens": ("<1024", "1024-4095", "4096-16383", ">=16384"),
    "output_tokens": ("<128", "128-511", "512-2047", "2048-8191", ">=8192"),
}
COVERAGE_KEY = "datagen-coverage"  # the run's Prefect artifact
LANGUAGE_SAMPLE = 2000  # prompts decoded for the languages dimension
LANGUAGE_SHARDS = 32  # shards they are read from
_TEXT_TAIL = 4000  # characters of a prompt's end looked at (its latest messages)
_ASCII_LETTER = re.compile("[A-Za-z]")  # what str.isalpha() accepts among ASCII characters
_NON_LATIN_MIN = 0.1  # share of letters a non-Latin script needs to name the prompt
UNKNOWN = "unknown"
OTHER = "other"
WITH = "with"
_COLUMNS: tuple[str, ...] = ("mode", "has_tools", "has_tool_results", "images", "user_turns")
_COLUMNS = (*_COLUMNS, "prompt_tokens", "completion_tokens")
_SCRIPT_RANGES = (
    ("greek", 0x370, 0x3FF),
    ("cyrillic", 0x400, 0x52F),
    ("hebrew", 0x590, 0x5FF),
    ("arabic", 0x600, 0x6FF),
    ("arabic", 0x750, 0x77F),
    ("devanagari", 0x900, 0x97F),
    ("thai", 0xE00, 0xE7F),
    ("hangul", 0x1100, 0x11FF),
    ("latin", 0x1E00, 0x1EFF),
    ("kana", 0x3040, 0x30FF),
    ("hangul", 0x3130, 0x318F),
    ("han", 0x3400, 0x4DBF),
    ("han", 0x4E00, 0x9FFF),
    ("hangul", 0xAC00, 0xD7AF),
    ("han", 0xF900, 0xFAFF),
    ("latin", 0xFF21, 0xFF5A),
    ("han", 0x20000, 0x3FFFF),
)


def char_script(ch: str) -> str:
    """The script of one letter (Unicode blocks, not a language)."""
    cp = ord(ch)
    if cp < 0x250:
        return "latin"
    for name, lo, hi in _SCRIPT_RANGES:
        if lo <= cp <= hi:
            return name
    return OTHER


def script_of(text: str) -> str:
    """A prompt's script: the most frequent non-Latin script when it holds at least 10% of
    the letters (role names, JSON keys and tool schemas are Latin in any language), else
    Latin; Han with any kana counts as kana (Japanese); no letters at all is ``other``."""
    tail = text[-_TEXT_TAIL:]
    if tail.isascii():  # most prompts: no character-by-character pass
        return "latin" if _ASCII_LETTER.search(tail) else OTHER
    counts: Counter[str] = Counter()
    for ch, n in Counter(tail).items():  # each distinct character once
        if ch.isalpha():
            counts[char_script(ch)] += n
    letters = sum(counts.values())
    if not letters:
        return OTHER
    if counts["kana"]:
        counts["kana"] += counts.pop("han", 0)
    others = [(n, s) for s, n in counts.items() if s != "latin"]
    if others:
        n, script = max(others)
        if n >= _NON_LATIN_MIN * letters:
            return script
    return "latin"


@dataclass
class Mix:
    """The data's counts per dimension (name -> key -> records)."""

    records: int = 0
    counts: dict[str, Counter[str]] = field(
        default_factory=lambda: {name: Counter() for name, _ in DIMENSIONS}
    )
    language_sample: int = 0  # prompts decoded for languages (0: not estimated)
    notes: list[str] = field(default_factory=list)

    def share(self, dim: str, key: str) -> float:
        total = self.language_sample if dim == "languages" else self.records
        return self.counts[dim][key] / total if total else 0.0


@dataclass(frozen=True, slots=True)
class Row:
    """One line of the table: a dimension's key, the profile's share and the data's."""

    dimension: str
    key: str
    profile: float | None  # None: no profile for this dimension
    dataset: float | None  # None: the data cannot say (columns it predates)
    records: int
    flag: str = ""  # "" | "off" | "missing"


@dataclass
class Coverage:
    mix: Mix
    rows: list[Row]
    profile: ServingProfile | None

    @property
    def flagged(self) -> list[str]:
        """The dimensions with a flagged row, in table order."""
        return list(dict.fromkeys(r.dimension for r in self.rows if r.flag))

    def to_dict(self) -> dict[str, Any]:
        return {
            "records": self.mix.records,
            "language_sample": self.mix.language_sample,
            "tolerance": self.profile.tolerance if self.profile else None,
            "flagged": self.flagged,
            "notes": self.mix.notes,
            "rows": [
                {
                    "dimension": r.dimension,
                    "key": r.key,
                    "profile": r.profile,
                    "dataset": r.dataset,
                    "records": r.records,
                    "flag": r.flag,
                }
                for r in self.rows
            ],
        }


def _labels(dim: str, profile: ServingProfile | None) -> tuple[str, ...]:
    declared = getattr(profile, dim, None) if profile else None
    return tuple(declared) if declared else DEFAULT_BUCKETS[dim]


def bucket_counts(values: np.ndarray, labels: Iterable[str]) -> Counter[str]:
    """How many ``values`` fall in each bucket; those in none count as ``other``."""
    out: Counter[str] = Counter()
    inside = np.zeros(len(values), dtype=bool)
    for label in labels:
        lo, hi = parse_bucket(label)
        mask = values >= lo if hi is None else (values >= lo) & (values <= hi)
        out[label] = int(mask.sum())
        inside |= mask
    if (rest := int((~inside).sum())) > 0:
        out[OTHER] = rest
    return out


def _binary(table: Any, column: str) -> Counter[str]:
    n = table.num_rows
    if column not in table.column_names:
        return Counter({UNKNOWN: n})
    col = table[column]
    if column == "images":  # a list: any image at all
        col = pc.greater(pc.list_value_length(col), 0)
    true = int(pc.sum(pc.fill_null(col, False)).as_py() or 0)
    null = int(col.null_count) if column != "images" else 0
    return Counter({WITH: true, "without": n - true - null, UNKNOWN: null})


def _add_shard(mix: Mix, path: Path, profile: ServingProfile | None) -> None:
    names = set(pq.read_schema(path).names)
    table = pq.read_table(path, columns=[c for c in _COLUMNS if c in names])
    n = table.num_rows
    mix.records += n
    c = mix.counts
    if "mode" in names:
        modes = pc.fill_null(table["mode"], "default").to_pylist()
        c["modes"].update(str(m) for m in modes)
    else:
        c["modes"]["default"] += n
    for dim, column in (("tools", "has_tools"), ("tool_results", "has_tool_results")):
        c[dim].update(_binary(table, column))
    c["images"].update(_binary(table, "images"))
    if "user_turns" in names:
        turns = table["user_turns"]
        c["turns"][UNKNOWN] += turns.null_count
        known = turns.drop_null().to_numpy()
        c["turns"].update(bucket_counts(known, _labels("turns", profile)))
    else:
        c["turns"][UNKNOWN] += n
    for dim, column in (("input_tokens", "prompt_tokens"), ("output_tokens", "completion_tokens")):
        values = table[column].to_numpy()
        c[dim].update(bucket_counts(values, _labels(dim, profile)))


def _add_languages(mix: Mix, ds: DatasetDir, paths: list[Path], sample: int) -> None:
    """Decode about ``sample`` prompts, evenly spaced in up to ``LANGUAGE_SHARDS`` shards
    evenly spaced over the dataset (reading every shard's prompt ids would read the whole
    dataset); name each prompt by its script."""
    try:
        tok = ds.load_tokenizer().tok
    except DatagenError as err:
        mix.notes.append(f"languages not estimated: {err}")
        return
    picked = paths[:: max(1, math.ceil(len(paths) / LANGUAGE_SHARDS))]
    per_shard = math.ceil(sample / len(picked))
    for path in picked:
        rows = pq.ParquetFile(path).metadata.num_rows
        take = sorted({i * rows // per_shard for i in range(per_shard)}) if rows else []
        if not take:
            continue
        ids = pq.read_table(path, columns=["prompt_ids"])["prompt_ids"].take(take).to_pylist()
        for text in tok.batch_decode(ids, skip_special_tokens=True):
            mix.counts["languages"][script_of(text)] += 1
        mix.language_sample += len(take)


def compare(mix: Mix, profile: ServingProfile | None) -> Coverage:
    """The table: per dimension, the profile's shares beside the data's, flagged rows."""
    rows: list[Row] = []
    for dim, _ in DIMENSIONS:
        declared = getattr(profile, dim, None) if profile else None
        rows += _dimension_rows(mix, dim, declared, profile.tolerance if profile else 0.0)
    return Coverage(mix, rows, profile)


def _dimension_rows(mix: Mix, dim: str, declared: Any, tolerance: float) -> list[Row]:
    counts = mix.counts[dim]
    known = sum(n for k, n in counts.items() if k != UNKNOWN)
    if dim in BINARY:
        shares: dict[str, float] | None = None if declared is None else {WITH: float(declared)}
        keys = [WITH] if known else []
    else:
        shares = declared
        keys = [k for k, _ in counts.most_common() if k != UNKNOWN]
        if dim in DEFAULT_BUCKETS or shares:
            order = list(shares or DEFAULT_BUCKETS[dim])
            keys = order + [k for k in keys if k not in order]
    rows: list[Row] = []
    for key in keys:
        expected = None if shares is None else shares.get(key, 0.0)
        got = mix.share(dim, key) if known else None
        if expected is None and not counts[key] and dim not in BINARY:
            continue  # the data's own mix: empty default buckets say nothing
        rows.append(Row(dim, key, expected, got, counts[key], _flag(expected, got, tolerance)))
    if counts[UNKNOWN] or (shares and not known and not keys):
        flag = "missing" if shares and not known else ""
        rows.append(Row(dim, UNKNOWN, None, mix.share(dim, UNKNOWN), counts[UNKNOWN], flag))
    return rows


def _flag(expected: float | None, got: float | None, tolerance: float) -> str:
    if expected is None:
        return ""
    if got is None or (expected > 0 and got == 0):
        return "missing"
    return "off" if abs(expected - got) > tolerance + 1e-9 else ""


def dataset_coverage(
    root: str | Path,
    profile: ServingProfile | None = None,
    *,
    partitions: list[str] | None = None,
    language_sample: int = LANGUAGE_SAMPLE,
) -> Coverage:
    """Read the mix of a finished dataset's committed records (``partitions``: only these) and
    compare it with ``profile`` (None: the data's own mix)."""
    ds = DatasetDir(root)
    mix = Mix()
    paths: list[Path] = []
    known = ds.partitions()
    unknown = sorted(set(partitions or ()) - set(known))
    if unknown:
        raise DatasetError(f"{ds.root}: no partition {', '.join(unknown)}; it has {known}")
    for name in partitions or known:
        shards, _ = ds.shards(name)
        paths += [s.path for s in shards]
    for path in paths:
        _add_shard(mix, path, profile)
    if paths and language_sample:
        _add_languages(mix, ds, paths, language_sample)
    return compare(mix, profile)


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def table_rows(cov: Coverage) -> list[dict[str, str]]:
    """The table as rows of strings (a Prefect table artifact, the terminal, the card)."""
    headers = dict(DIMENSIONS)
    out = []
    for r in cov.rows:
        row = {"dimension": headers[r.dimension], "bucket": r.key}
        if cov.profile is not None:
            row["profile"] = _pct(r.profile)
        row |= {"dataset": _pct(r.dataset), "records": str(r.records)}
        if cov.profile is not None:
            row["flag"] = r.flag.upper()
        out.append(row)
    return out


def coverage_line(cov: Coverage) -> str:
    """One sentence: against what, how many records, what is flagged."""
    mix = cov.mix
    langs = (
        f"languages by the Unicode script of {mix.language_sample} sampled prompts"
        if mix.language_sample
        else "languages not estimated"
    )
    if cov.profile is None:
        head = f"The data's own mix over {mix.records} records (no serving profile declared)"
        return f"{head}; {langs}."
    flagged = ", ".join(cov.flagged) or "none"
    return (
        f"{mix.records} records against the serving profile (tolerance "
        f"{100 * cov.profile.tolerance:.1f} points); {langs}. Flagged: {flagged}."
    )


def coverage_markdown(cov: Coverage, heading: str = "#") -> str:
    """The sentence and the table, flags in bold."""
    rows = table_rows(cov)
    if not rows:
        return f"{heading} Coverage\n\n{coverage_line(cov)}\n"
    cols = list(rows[0])
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for row in rows:
        cells = [f"**{v}**" if k == "flag" and v else v for k, v in row.items()]
        lines.append("| " + " | ".join(cells) + " |")
    notes = "".join(f"\n\n{n}" for n in cov.mix.notes)
    return f"{heading} Coverage\n\n{coverage_line(cov)}{notes}\n\n" + "\n".join(lines) + "\n"


def coverage_text(cov: Coverage) -> str:
    """The table in aligned columns for a terminal, then the sentence and any notes."""
    rows = table_rows(cov)
    if not rows:
        return coverage_line(cov)
    cols = list(rows[0])
    width = {c: max(len(c), *(len(r[c]) for r in rows)) for c in cols}
    lines = ["  ".join(c.ljust(width[c]) for c in cols).rstrip()]
    lines += ["  ".join(r[c].ljust(width[c]) for c in cols).rstrip() for r in rows]
    return "\n".join([*lines, "", coverage_line(cov), *cov.mix.notes])
