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

import pytest

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


def config(tmp_path: Path, *prompts: Path) -> PipelineConfig:
    """Partitions named after their files' stems, one tier."""
    return PipelineConfig.model_validate(
        {
            "model": {"path": str(TOKENIZER_DIR)},
            "tiers": [{"name": "T", "concurrency": 64, "max_tokens": 512}],
            "partitions": [{"name": p.stem, "input": str(p), "tier": "T"} for p in prompts],
            "output_dir": str(tmp_path / "out"),
            "batch_size": 512,
        }
    )


async def test_no_callback_blocks_the_loop_during_a_run(tmp_path: Path, emulator_factory: Any):
    emu = emulator_factory("--emu-mean-output-tokens", "200", "--emu-output-sigma", "0")
    emu.wait_ready()
    prompts = write_prompts(tmp_path / "p.jsonl", 1024, words=120)
    cfg = config(tmp_path, prompts)
    gc.collect()
    with loop_probe() as slow:
        await run_batches(cfg, emu.url)
    assert len(records(Path(cfg.output_dir), "p")) == 1024  # the run did its work
    worst = sorted(slow, reverse=True)[:5]
    blocked = [(round(s * 1e3, 1), what) for s, what in worst if s > BLOCKED_S]
    assert not blocked, f"callbacks held the loop longer than {BLOCKED_S * 1e3:.0f} ms: {blocked}"


@pytest.mark.usefixtures("prefect_backend")
def test_partition_planning_runs_off_the_flows_event_loop(
    tmp_path: Path, emulator_factory: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The parent flow starts every partition's subflow on one event loop; a partition's plan
    (loading the tokenizer, scanning its input: seconds on a large file) is made on a worker
    thread, so the other subflows start meanwhile. The real flow, in this process; the plan
    function itself is only observed: which thread ran it, and was an event loop running there."""
    import eagle3_datagen_flows.partition as partition_flow
    from eagle3_datagen_cli.flow_run import run_pipeline

    planned: list[tuple[str, bool]] = []
    plan_partition = partition_flow.plan_partition

    def observed(config: PipelineConfig, partition: str) -> Any:
        try:
            asyncio.get_running_loop()
            on_a_loop = True
        except RuntimeError:
            on_a_loop = False
        planned.append((partition, on_a_loop))
        return plan_partition(config, partition)

    monkeypatch.setattr(partition_flow, "plan_partition", observed)
    emu = emulator_factory("--emu-mean-output-tokens", "20")
    emu.wait_ready()
    cfg = config(
        tmp_path,
        write_prompts(tmp_path / "a.jsonl", 40, words=20),
        write_prompts(tmp_path / "b.jsonl", 40, words=20, first=100),
    )
    ok, result = run_pipeline(cfg, server_url=emu.url)
    assert ok, result
    assert sorted(planned) == [("a", False), ("b", False)], "a plan was made on the event loop"
    assert len(records(Path(cfg.output_dir), "a")) == len(records(Path(cfg.output_dir), "b")) == 40
