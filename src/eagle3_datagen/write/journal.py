"""Durable progress inside a batch: every finished request is appended as it arrives.

Why: a batch of 512 long generations can take an hour on a busy server. If the process is
killed, the batch's commit marker is never written, and without a journal its whole hour would
be sent again. With it, a rerun re-sends only the requests that were in flight at the kill.

Each line is one JSON object written and flushed on its own: a SIGKILL leaves at most one torn
last line, which is ignored. The journal is deleted once its batch is committed.

Entries are keyed by what the request was (:func:`prompt_key`: the prompt's id and its prompt
ids), not by where it sat in the input, so an entry is reused only for the very same prompt even
if the input file changed between the kill and the rerun.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from array import array
from collections.abc import Sequence
from pathlib import Path
from typing import IO

import orjson

from eagle3_datagen.sglang.client import GenerateResult
from eagle3_datagen.write.shards import write_failed

# asdict() deep-copies every output id (~1.8 ms per 200-token record, measured); the fields are
# flat, so a shallow dict serializes the same JSON.
_FIELDS = tuple(f.name for f in dataclasses.fields(GenerateResult))


def prompt_key(prompt_id: str, prompt_ids: list[int], images: Sequence[str] = ()) -> int:
    """A 128-bit key of (id, prompt ids, image digests): what makes a request the same request.

    The chat template, tokenizer and sampling are the same for every record of an output
    directory (a rerun under other settings is refused), so these decide the result; an image
    changed under the same path changes its digest, so its request is sent again.
    """
    h = hashlib.blake2b(prompt_id.encode(), digest_size=16)
    h.update(b"\0")
    h.update(array("i", prompt_ids).tobytes())
    for digest in images:
        h.update(b"\0" + digest.encode())
    return int.from_bytes(h.digest(), "little")


class BatchJournal:
    """Finished results of one uncommitted batch, keyed by :func:`prompt_key`."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fh: IO[bytes] | None = None

    def load(self) -> dict[int, GenerateResult]:
        """Results recorded by earlier attempts; a torn trailing line is dropped, and so are
        entries of an older layout (keyed by line number, which says nothing of the prompt)."""
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return {}
        done: dict[int, GenerateResult] = {}
        for raw in data.split(b"\n"):
            if not raw:
                continue
            try:
                entry = orjson.loads(raw)
                key = int(entry.pop("key"), 16)
                entry.pop("line", None)
                done[key] = GenerateResult(**entry)
            except (orjson.JSONDecodeError, TypeError, KeyError, ValueError):
                continue  # the line being written when the process died
        return done

    def append(self, key: int, result: GenerateResult) -> None:
        """Add one finished result; a failed write (a full disk) raises OutputWriteError (a
        torn line it may leave is skipped by :meth:`load`)."""
        try:
            self._append(key, result)
        except OSError as err:
            raise write_failed(self.path, err) from err

    def append_many(self, items: list[tuple[int, GenerateResult]]) -> None:
        """Add finished results with one write and one flush; errors as :meth:`append`."""
        try:
            self._write(items)
        except OSError as err:
            raise write_failed(self.path, err) from err

    def _append(self, key: int, result: GenerateResult) -> None:
        self._write([(key, result)])

    def _write(self, items: list[tuple[int, GenerateResult]]) -> None:
        if self._fh is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._fh = open(self.path, "ab")  # noqa: SIM115 - closed in close()
            if self._fh.tell() and not self._ends_with_newline():
                self._fh.write(b"\n")  # fence off a torn line left by a kill
        lines = []
        for key, result in items:
            entry = {name: getattr(result, name) for name in _FIELDS}
            entry["key"] = f"{key:032x}"
            lines.append(orjson.dumps(entry))
        self._fh.write(b"\n".join(lines) + b"\n")
        self._fh.flush()  # in the kernel now: survives a kill of this process

    def _ends_with_newline(self) -> bool:
        with open(self.path, "rb") as fh:
            fh.seek(-1, os.SEEK_END)
            return fh.read(1) == b"\n"

    def close(self) -> None:
        """Close the file; what a full disk kept in its buffer fails here as OutputWriteError
        (named by the journal's path), and the file is closed either way."""
        if self._fh is not None:
            fh, self._fh = self._fh, None
            try:
                fh.close()
            except OSError as err:
                raise write_failed(self.path, err) from err

    def remove(self) -> None:
        self.close()
        self.path.unlink(missing_ok=True)
