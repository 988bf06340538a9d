"""CPU and disk work off the event loop: the loop only waits.

The loop that runs a partition also handles every HTTP response of every partition in the
process. A render of 512 prompts, a Parquet write with its fsync or a journal flush on it holds
every response's handling behind it (and makes a kept-alive connection look idle to the server's
5 s timer). So that work runs on a thread pool sized to the machine: the tokenizer's Rust
encoder, pyarrow and the kernel's writes release the GIL, and what holds it (Jinja) is cut into
the interpreter's 5 ms switch intervals, so the loop gets its turn.

Renders are serialized by one lock: a tokenizer object is shared by the partitions that use the
same files (it is loaded once per process), and not every tokenizer (a remote-code Python one)
is safe to call from two threads at once; the GIL would serialize their Python work anyway.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from eagle3_datagen.errors import OutputWriteError
from eagle3_datagen.inputs.prompts import Prompt
from eagle3_datagen.render.chat_tokenizer import ChatTokenizer, RenderError
from eagle3_datagen.sglang.client import GenerateResult
from eagle3_datagen.write.journal import BatchJournal

T = TypeVar("T")

_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()
_render_lock = threading.Lock()


def pool() -> ThreadPoolExecutor:
    """The process's worker threads: one per core (what the GIL-free parts can use), at least 2
    so a long write never waits behind a render."""
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(
                max_workers=max(2, os.cpu_count() or 2), thread_name_prefix="datagen-work"
            )
        return _pool


async def off_loop(fn: Callable[..., T], *args: object) -> T:
    """``fn(*args)`` on the worker threads; the loop serves other requests meanwhile."""
    return await asyncio.get_running_loop().run_in_executor(pool(), functools.partial(fn, *args))


def render(tokenizer: ChatTokenizer, prompts: Sequence[Prompt]) -> list[list[int] | RenderError]:
    """``tokenizer.render`` for a worker thread: one render at a time in the process."""
    with _render_lock:
        return tokenizer.render(prompts)


class JournalWriter:
    """A batch journal's appends, written by a worker thread in the order they came.

    Results that finish while a write is on its way are written together by the next one (one
    write and flush for many results). A failed write (a full disk) is raised by the next
    :meth:`add` and by :meth:`drain`, which the batch calls before it commits.
    """

    def __init__(self, journal: BatchJournal) -> None:
        self.journal = journal
        self._pending: list[tuple[int, GenerateResult]] = []
        self._flushing: asyncio.Task[None] | None = None
        self._error: Exception | None = None
        self._file = threading.Lock()  # a write on its way and close() never overlap

    def add(self, key: int, result: GenerateResult) -> None:
        if self._error is not None:
            raise self._error
        self._pending.append((key, result))
        if self._flushing is None:
            self._flushing = asyncio.get_running_loop().create_task(self._flush())

    def _write(self, items: list[tuple[int, GenerateResult]]) -> None:
        with self._file:
            self.journal.append_many(items)

    async def _flush(self) -> None:
        try:
            while self._pending and self._error is None:
                items, self._pending = self._pending, []
                await off_loop(self._write, items)
        except Exception as err:
            self._error = err
        finally:
            self._flushing = None

    async def drain(self) -> None:
        """Wait until everything added is written; raise the error of a write that failed."""
        while self._flushing is not None:
            await asyncio.shield(self._flushing)
        if self._error is not None:
            raise self._error

    async def close(self) -> None:
        """Drain (errors are the batch's to raise, via :meth:`drain`), then close the file."""
        with contextlib.suppress(Exception, asyncio.CancelledError):
            await self.drain()
        with self._file:
            try:
                self.journal.close()
            except OutputWriteError:
                if self._error is None:  # otherwise the write that failed first is the reason
                    raise
