"""CPU and disk work off the event loop: the loop only waits.

The loop that runs a partition also handles every HTTP response of every partition in the
process. A render of 512 prompts, a Parquet write with its fsync or a journal flush on it holds
every response's handling behind it (and makes a kept-alive connection look idle to the server's
5 s timer). So that work runs on a thread pool sized to the machine: the tokenizer's Rust
encoder, pyarrow and the kernel's writes release the GIL, and what holds it (Jinja) is cut into
the interpreter's 5 ms switch intervals, so the loop gets its turn. Journal appends, one per
finished request, go to a thread of their own through a queue (:class:`JournalWriter`).

Renders are serialized by one lock: a tokenizer object is shared by the partitions that use the
same files (it is loaded once per process), and not every tokenizer (a remote-code Python one)
is safe to call from two threads at once; the GIL would serialize their Python work anyway.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import queue
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
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
    """A batch journal's appends, written by the process's journal thread in the order they came.

    Why a thread of its own and not :func:`off_loop`: a journal append comes with every finished
    request, and a round trip through the executor (a future, a wake-up of the loop through its
    self-pipe, the loop's turn to resume the flush) cost ~250 us of CPU per append on 2 shared
    cores, more than the write itself; a put on the journal thread's queue costs ~35 us and the
    loop is never woken for it. Results queued while the thread writes are written together by
    its next write (one write and flush for many results). A failed write (a full disk) is
    raised by the next :meth:`add` and by :meth:`drain`, which the batch calls before it commits.
    """

    def __init__(self, journal: BatchJournal) -> None:
        self.journal = journal
        self._error: Exception | None = None  # set by the journal thread
        self._file = threading.Lock()  # a write on its way and close() never overlap

    def add(self, key: int, result: GenerateResult) -> None:
        if self._error is not None:
            raise self._error
        _journal_queue().put((self, (key, result)))

    def _write(self, items: list[tuple[int, GenerateResult]]) -> None:
        """On the journal thread: one write of ``items``; the first failure is kept, and later
        items of this journal are dropped (the batch fails on it)."""
        if self._error is not None:
            return
        try:
            with self._file:
                self.journal.append_many(items)
        except Exception as err:
            self._error = err

    async def drain(self) -> None:
        """Wait until everything added is written; raise the error of a write that failed."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()
        _journal_queue().put((self, _Drained(loop, done)))
        await asyncio.shield(done)
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


@dataclass(frozen=True, slots=True)
class _Drained:
    """A marker in the journal queue: everything its writer added before it is written."""

    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[None]

    def signal(self) -> None:
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile: nobody waits
            self.loop.call_soon_threadsafe(_resolve, self.future)


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


_JournalItem = tuple[JournalWriter, "tuple[int, GenerateResult] | _Drained"]
_queue: queue.SimpleQueue[_JournalItem] | None = None


def _journal_queue() -> queue.SimpleQueue[_JournalItem]:
    """The journal thread's queue (the thread starts with the first append)."""
    global _queue
    with _pool_lock:
        if _queue is None:
            _queue = queue.SimpleQueue()
            threading.Thread(
                target=_write_journals, args=(_queue,), name="datagen-journal", daemon=True
            ).start()
        return _queue


def _forget_journal_thread() -> None:
    """In a forked child: the parent's journal thread did not come along, so the child's first
    append starts its own (a drain would otherwise wait for a thread that is not there)."""
    global _queue
    _queue = None


os.register_at_fork(after_in_child=_forget_journal_thread)


def _write_journals(items: queue.SimpleQueue[_JournalItem]) -> None:
    """The journal thread: what is queued, in order, each journal's run of results in one write."""
    while True:
        batch = [items.get()]
        with contextlib.suppress(queue.Empty):
            while len(batch) < 4096:
                batch.append(items.get_nowait())
        pending: dict[JournalWriter, list[tuple[int, GenerateResult]]] = {}
        for writer, item in batch:
            if isinstance(item, _Drained):
                if writer in pending:
                    writer._write(pending.pop(writer))
                item.signal()
            else:
                pending.setdefault(writer, []).append(item)
        for writer, results in pending.items():
            writer._write(results)
