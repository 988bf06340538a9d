"""The event loop only waits: during a partition's run no callback on the loop's thread spends
more than 50 ms of CPU (rendering 512 prompts, a Parquet write with its fsync, journal writes
belong on worker threads; ``generate/offload.py``).

The probe times every callback the loop runs (task steps included) by the loop thread's own CPU
clock (``time.thread_time``), not by the wall clock that asyncio's debug mode reports: on a
shared machine a callback's wall time includes the moments the OS ran someone else, which is
not the loop being blocked by us.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from eagle3_datagen.config import PipelineConfig
from eagle3_datagen.demo import TOKENIZER_DIR
from tests.support.pipeline import records, run_batches
from tests.support.prompts import write_prompts

BLOCKED_S = 0.050


@contextlib.contextmanager
def loop_probe() -> Iterator[list[tuple[float, str]]]:
    """While installed, every callback run on this thread adds (its CPU seconds, what it was)
    to the yielded list when it took more than a millisecond."""
    slow: list[tuple[float, str]] = []
    handle_run = asyncio.Handle._run
    thread = threading.get_ident()

    def timed(self: asyncio.Handle) -> None:
        if threading.get_ident() != thread:
            return handle_run(self)
        t0 = time.thread_time()
        try:
            return handle_run(self)
        finally:
            spent = time.thread_time() - t0
            if spent > 0.001:
                slow.append((spent, repr(self)[:300]))

    asyncio.Handle._run = timed  # type: ignore[method-assign]
    try:
        yield slow
    finally:
        asyncio.Handle._run = handle_run  # type: ignore[method-assign]


def config(tmp_path: Path, prompts: Path) -> PipelineConfig:
    return PipelineConfig.model_validate(
        {
            "model": {"path": str(TOKENIZER_DIR)},
            "tiers": [{"name": "T", "concurrency": 64, "max_tokens": 512}],
            "partitions": [{"name": "p", "input": str(prompts), "tier": "T"}],
            "output_dir": str(tmp_path / "out"),
            "batch_size": 512,
        }
    )


async def test_no_callback_blocks_the_loop_during_a_run(tmp_path: Path, emulator_factory: Any):
    emu = emulator_factory("--emu-mean-output-tokens", "200", "--emu-output-sigma", "0")
    emu.wait_ready()
    prompts = write_prompts(tmp_path / "in.jsonl", 1024, words=120)
    cfg = config(tmp_path, prompts)
    gc.collect()
    with loop_probe() as slow:
        await run_batches(cfg, emu.url)
    assert len(records(Path(cfg.output_dir), "p")) == 1024  # the run did its work
    worst = sorted(slow, reverse=True)[:5]
    blocked = [(round(s * 1e3, 1), what) for s, what in worst if s > BLOCKED_S]
    assert not blocked, f"callbacks held the loop longer than {BLOCKED_S * 1e3:.0f} ms: {blocked}"
