"""Reading partition input: plan batches by streaming the file, then parse one batch's lines.

Why byte ranges: a batch is described by ``(path, start, stop)`` offsets, so the planner streams
the file once without holding prompts in memory (1M-prompt partitions), a Prefect task receives
a few integers instead of thousands of prompts, and a rerun re-plans the same batches.

Every line ends as a :class:`Prompt` or an :class:`InputReject` that names the file, the line
and the reason; a bad line never stops the others.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from eagle3_datagen.errors import InputFileError
from eagle3_datagen.inputs.images import (
    BadImage,
    LoadedImage,
    image_parts,
    part_url,
    read_image_ref,
)

ROLES = frozenset({"system", "user", "assistant", "tool"})
_READ_CHUNK = 1 << 20


@dataclass(frozen=True, slots=True)
class BatchSpec:
    """A slice of one partition's input: byte offsets for JSONL, row offsets for Parquet."""

    partition: str
    index: int
    path: str
    start: int
    stop: int
    first_line: int  # 1-based line (JSONL) or row (Parquet) number of the first item
    count: int
    # What the batch is made of (file, lines, their bytes, which of them repeat an earlier id):
    # its commit marker counts for a rerun only while this is unchanged (set by ``scan_input``).
    key: str = ""
    # The digest of its bytes (rows) when planned: a batch read later must read the same, or
    # the input changed under the running partition (set by ``scan_input``; "" checks nothing).
    digest: str = ""

    @property
    def label(self) -> str:
        return f"{self.partition}/{self.index:04d}"


@dataclass(slots=True)
class Prompt:
    """A parsed, well-formed input line (trailing assistant message already dropped)."""

    id: str
    line: int
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    # The line's images by reference (path, file:// URL or data URI), read and checked; the
    # request sends them in the order the rendered prompt meets them (docs/images.md).
    images: dict[str, LoadedImage] = field(default_factory=dict)
    # The line's serving mode (its "mode", then inputs/modes.py's assignment) and the
    # chat-template kwargs it renders with over model.chat_template_kwargs (docs/modes.md).
    mode: str | None = None
    kwargs: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class InputReject:
    """An input line that cannot become a prompt, kept with its reason and raw text."""

    line: int
    reason: str
    raw: str
    id: str | None = None


def is_parquet(path: str | Path) -> bool:
    return str(path).lower().endswith((".parquet", ".pq"))


def plan_batches(partition: str, path: str | Path, batch_size: int) -> Iterator[BatchSpec]:
    """Yield consecutive batches of ``batch_size`` lines without loading the file."""
    path = Path(path)
    if not path.is_file():
        raise InputFileError(f"{path}: input file not found for partition {partition!r}")
    if is_parquet(path):
        yield from _plan_parquet(partition, path, batch_size)
    else:
        yield from _plan_jsonl(partition, path, batch_size)


def _plan_jsonl(partition: str, path: Path, batch_size: int) -> Iterator[BatchSpec]:
    index, line_no, start, pos, count = 0, 0, 0, 0, 0
    try:
        with path.open("rb") as fh:
            tail = b""
            while chunk := fh.read(_READ_CHUNK):
                data = tail + chunk
                base = pos - len(tail)
                cursor = 0
                while (nl := data.find(b"\n", cursor)) != -1:
                    cursor = nl + 1
                    line_no += 1
                    count += 1
                    if count == batch_size:
                        stop = base + cursor
                        yield BatchSpec(
                            partition, index, str(path), start, stop, line_no - count + 1, count
                        )
                        index, start, count = index + 1, stop, 0
                tail = data[cursor:]
                pos += len(chunk)
            if tail:  # last line without a newline
                line_no += 1
                count += 1
            if count:
                yield BatchSpec(partition, index, str(path), start, pos, line_no - count + 1, count)
    except OSError as err:
        raise InputFileError(f"{path}: cannot read input: {err.strerror or err}") from None


def _plan_parquet(partition: str, path: Path, batch_size: int) -> Iterator[BatchSpec]:
    import pyarrow.parquet as pq

    try:
        rows = pq.ParquetFile(path).metadata.num_rows
    except Exception as err:  # pyarrow raises several types for a corrupt file
        raise InputFileError(f"{path}: not a readable Parquet file: {err}") from None
    for index, start in enumerate(range(0, rows, batch_size)):
        stop = min(start + batch_size, rows)
        yield BatchSpec(partition, index, str(path), start, stop, start + 1, stop - start)


def bytes_digest(data: bytes) -> str:
    """The digest of a JSONL batch's bytes (what ``BatchSpec.digest`` holds)."""
    return hashlib.blake2b(data, digest_size=16).hexdigest()


def rows_digest(rows: Iterable[dict[str, Any]]) -> str:
    """The digest of a Parquet batch's rows (what ``BatchSpec.digest`` holds)."""
    h = hashlib.blake2b(digest_size=16)
    for row in rows:
        h.update(orjson.dumps(row, option=orjson.OPT_SORT_KEYS, default=str))
        h.update(b"\n")
    return h.hexdigest()


def read_batch(spec: BatchSpec) -> list[tuple[int, bytes | dict[str, Any]]]:
    """The batch's items as ``(line_number, raw line bytes)`` or ``(row_number, row dict)``.

    Raises InputFileError when the file is gone, or when the batch no longer reads what was
    planned (the input changed under the running partition: no retry can fix that)."""
    items: list[tuple[int, bytes | dict[str, Any]]]
    if is_parquet(spec.path):
        items = _read_parquet_rows(spec)
        got = rows_digest(row for _, row in items if isinstance(row, dict)) if spec.digest else ""
    else:
        data = read_range(spec)
        items = split_lines(spec, data)
        got = bytes_digest(data) if spec.digest else ""
    if got != spec.digest:
        last = spec.first_line + spec.count - 1
        raise InputFileError(
            f"{spec.path}: changed while partition {spec.partition!r} was running (lines "
            f"{spec.first_line}-{last} differ from what was planned); rerun to pick up the "
            "change (committed batches of unchanged lines are kept)"
        )
    return items


def read_range(spec: BatchSpec) -> bytes:
    """The raw bytes of a JSONL batch."""
    try:
        with open(spec.path, "rb") as fh:
            fh.seek(spec.start)
            return fh.read(spec.stop - spec.start)
    except OSError as err:
        raise InputFileError(f"{spec.path}: cannot read input: {err.strerror or err}") from None


def split_lines(spec: BatchSpec, data: bytes) -> list[tuple[int, bytes | dict[str, Any]]]:
    """A JSONL batch's bytes as ``(line_number, raw line bytes)``."""
    lines = data.split(b"\n")
    if lines and lines[-1] == b"" and data.endswith(b"\n"):
        lines.pop()
    return [(spec.first_line + i, line) for i, line in enumerate(lines)]


def _read_parquet_rows(spec: BatchSpec) -> list[tuple[int, bytes | dict[str, Any]]]:
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(spec.path)
    except OSError as err:
        raise InputFileError(f"{spec.path}: cannot read input: {err.strerror or err}") from None
    out: list[tuple[int, bytes | dict[str, Any]]] = []
    row0 = 0
    for rg in range(pf.num_row_groups):
        n = pf.metadata.row_group(rg).num_rows
        lo, hi = max(spec.start, row0), min(spec.stop, row0 + n)
        if lo < hi:
            table = pf.read_row_group(rg).slice(lo - row0, hi - lo)
            for i, row in enumerate(table.to_pylist()):
                out.append((lo + i + 1, row))
        row0 += n
        if row0 >= spec.stop:
            break
    return out


def content_id(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> str:
    """A stable id from the prompt's content, for inputs that carry none."""
    blob = orjson.dumps({"messages": messages, "tools": tools}, option=orjson.OPT_SORT_KEYS)
    return "sha256:" + hashlib.sha256(blob).hexdigest()[:32]


def raw_text(raw: bytes | dict[str, Any], limit: int = 65536) -> str:
    if isinstance(raw, dict):
        return orjson.dumps(raw, default=str).decode()[:limit]
    return raw[:limit].decode("utf-8", "replace")


def parse_prompt(
    raw: bytes | dict[str, Any], line: int, image_dir: Path | None = None
) -> Prompt | InputReject:
    """Parse one input line; every problem becomes a reject naming the reason.

    With ``image_dir`` (the input file's folder, for relative paths) every image of the line is
    read and checked; without it only the parts' shape is (planning reads no image)."""
    if isinstance(raw, dict):
        obj: Any = raw
    else:
        if not raw.strip():
            return InputReject(line, "empty line", "")
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as err:
            return InputReject(line, f"not valid UTF-8 at byte {err.start}", raw_text(raw))
        try:
            obj = orjson.loads(text)
        except orjson.JSONDecodeError as err:
            return InputReject(line, f"invalid JSON: {err}", text[:65536])
    if not isinstance(obj, dict):
        return InputReject(line, f"expected a JSON object, got {type(obj).__name__}", raw_text(raw))

    rid = obj.get("id")
    if rid is not None and not isinstance(rid, (str, int)):
        return InputReject(line, f"'id' must be a string, got {type(rid).__name__}", raw_text(raw))
    rid_str = str(rid) if rid is not None else None
    if rid_str is not None and not rid_str.strip():
        return InputReject(line, "'id' is empty", raw_text(raw))

    def reject(reason: str) -> InputReject:
        return InputReject(line, reason, raw_text(raw), rid_str)

    messages = obj.get("messages")
    if messages is None:
        return reject("missing 'messages'")
    if not isinstance(messages, list):
        return reject(f"'messages' must be a list, got {type(messages).__name__}")
    if not messages:
        return reject("'messages' is empty")
    for i, msg in enumerate(messages):
        if not isinstance(msg, dict):
            return reject(f"messages[{i}] must be an object, got {type(msg).__name__}")
        role = msg.get("role")
        if role not in ROLES:
            return reject(
                f"messages[{i}] has unknown role {role!r} (expected one of {sorted(ROLES)})"
            )
        content = msg.get("content")
        if content is not None and not isinstance(content, (str, list)):
            return reject(f"messages[{i}].content must be a string or a list of parts")
    tools = obj.get("tools")
    if tools is not None and (
        not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools)
    ):
        return reject("'tools' must be a list of objects")
    if messages[-1].get("role") == "assistant":
        messages = messages[:-1]  # the reply we regenerate
    if not messages:
        return reject("no messages left after dropping the trailing assistant message")
    images: dict[str, LoadedImage] = {}
    for i, j, part in image_parts(messages):
        url = part_url(part)
        if url is None:
            return reject(f"messages[{i}].content[{j}]: image part without a URL")
        if image_dir is not None and url not in images:
            try:
                images[url] = read_image_ref(url, image_dir)
            except BadImage as err:
                return reject(f"messages[{i}].content[{j}]: bad image: {err}")
    mode = obj.get("mode")
    if mode is not None and (not isinstance(mode, str) or not mode):
        return reject("'mode' must be a non-empty string (a name declared in model.modes)")
    kwargs = obj.get("chat_template_kwargs")
    if kwargs is not None and not isinstance(kwargs, dict):
        return reject(f"'chat_template_kwargs' must be an object, got {type(kwargs).__name__}")
    prompt_id = rid_str or content_id(messages, tools or None)
    return Prompt(prompt_id, line, messages, tools or None, images, mode, dict(kwargs or {}))


class DuplicateFinder:
    """Lines whose id already appeared on an earlier line, found with ~16 bytes per prompt.

    Only an 8-byte hash and a line number are kept per prompt (a million-prompt partition
    costs ~16 MB). The first occurrence wins; a 64-bit hash collision between different ids
    (odds ~1e-8 at a million prompts) would be reported too.
    """

    def __init__(self) -> None:
        from array import array

        self._hashes, self._lines = array("Q"), array("Q")

    def add(self, prompt_id: str, line: int) -> None:
        digest = hashlib.blake2b(prompt_id.encode(), digest_size=8).digest()
        self._hashes.append(int.from_bytes(digest, "little"))
        self._lines.append(line)

    def duplicates(self) -> dict[int, int]:
        """``{line: first_line}`` for every line that repeats an earlier id."""
        import numpy as np

        from eagle3_datagen.inputs.near_dups import repeats

        lines = self._lines
        hashes = np.frombuffer(self._hashes, dtype=np.uint64)
        return {lines[i]: lines[first] for i, first in repeats(hashes)}


def find_duplicate_ids(partition: str, path: str | Path, batch_size: int = 4096) -> dict[int, int]:
    """Lines whose id already appeared on an earlier line: ``{line: first_line}``.

    Streams the file once (see :class:`DuplicateFinder` for the memory it takes).
    """
    finder = DuplicateFinder()
    for spec in plan_batches(partition, path, batch_size):
        for line, raw in read_batch(spec):
            parsed = parse_prompt(raw, line)
            if isinstance(parsed, Prompt):
                finder.add(parsed.id, line)
    return finder.duplicates()
