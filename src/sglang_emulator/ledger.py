"""Append-only record of every finished request, to compare against what the pipeline stored.

One JSON object per line, written and flushed just before the response bytes are sent, so any
response a client could have received is already on disk (a request whose client vanished
first may have a line that no client processed)::

    {"rid": str, "input_ids_sha256": hex sha256 of the prompt ids packed as little-endian int32,
     "prompt_tokens": int, "output_ids": [int, ...], "finish_reason": {...}, "ts": unix seconds}

Compute ``input_ids_sha256`` for a prompt with :func:`input_ids_sha256` (re-exported here).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import orjson

from sglang_emulator.vocab import input_ids_sha256

__all__ = ["Ledger", "input_ids_sha256"]


class Ledger:
    """Line-buffered JSONL writer; one ``os.write`` per line so lines never interleave."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def write(
        self,
        rid: str,
        digest_hex: str,
        prompt_tokens: int,
        output_ids: list[int],
        finish_reason: dict[str, Any],
    ) -> None:
        line = orjson.dumps(
            {
                "rid": rid,
                "input_ids_sha256": digest_hex,
                "prompt_tokens": prompt_tokens,
                "output_ids": output_ids,
                "finish_reason": finish_reason,
                "ts": time.time(),
            },
            option=orjson.OPT_APPEND_NEWLINE,
        )
        view = memoryview(line)
        while view:
            view = view[os.write(self._fd, view) :]

    def close(self) -> None:
        os.close(self._fd)
