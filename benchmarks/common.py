"""What every benchmark needs: an emulator process, synthetic prompts (both from
``tests.support``, shared with the tests), a config, a runner.

Why a separate emulator *process*: the client's CPU must be measured alone (``getrusage`` of
the client process), and the emulator must not share the client's event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import resource
import secrets
import subprocess
import sys
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

from tests.support import REPO, TOKENIZER_DIR
from tests.support.emulator import EmulatorProcess as Emulator
from tests.support.prompts import prompt_line, write_prompts

# Re-exported for the benchmark modules.
__all__ = ["REPO", "TOKENIZER_DIR", "Emulator", "prompt_line", "write_prompts"]


def cpu_s() -> float:
    """User + system CPU seconds of this process, all threads (pyarrow, Prefect) included."""
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def peak_rss_mb() -> float:
    """This process's RSS high-water mark (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def make_config(
    partitions: list[tuple[str, Path, str]],
    output_dir: Path,
    *,
    tiers: Sequence[tuple[str, int | str, int]] | None = None,
    batch_size: int = 512,
    max_requests: int | None = None,
    max_tokens: int | None = None,
) -> Any:
    """A pipeline config for the emulator: ``partitions`` are (name, input, tier) triples."""
    from eagle3_datagen.config import parse_config

    tiers = tiers or [("SHORT", 150, 10240), ("LONG", 32, 16384)]
    return parse_config(
        {
            "model": {"path": str(TOKENIZER_DIR)},
            "server": {
                "mode": "attach",
                "url": "http://127.0.0.1:1",
                "engine": "emulator",
                "max_requests_in_flight": max_requests,
                "max_tokens_in_flight": max_tokens,
            },
            "tiers": [{"name": n, "concurrency": c, "max_tokens": m} for n, c, m in tiers],
            "partitions": [{"name": n, "input": str(p), "tier": t} for n, p, t in partitions],
            "output_dir": str(output_dir),
            "batch_size": batch_size,
            "retries": {"max_attempts": 3, "backoff_initial_s": 0.2, "backoff_max_s": 1.0},
        },
        "benchmark",
    )


@contextlib.asynccontextmanager
async def partition_runner(
    config: Any, partition: str, url: str, budget: Any = None
) -> AsyncIterator[tuple[Any, list[Any], int]]:
    """The runner the partition subflow builds, minus Prefect: (runner, batches, window).

    Same planning (streamed batch plan, duplicate scan), same client sizing, same window.
    """
    from eagle3_datagen.generate.batch import PartitionRunner, connect_partition
    from eagle3_datagen.generate.context import PartitionJob, RunContext
    from eagle3_datagen.generate.plan import plan_partition

    plan = plan_partition(config, partition)
    run = RunContext(run_key=secrets.token_hex(4), budget=budget) if budget else None
    async with connect_partition(config, partition, url, None) as client:
        runner = PartitionRunner.from_plan(
            plan, PartitionJob(config, partition, url, run=run), client
        )
        runner.progress.total_lines = plan.total_lines
        yield runner, plan.batches, plan.window


async def run_partition(config: Any, partition: str, url: str, budget: Any = None) -> int:
    """All batches of one partition through ``run_windowed``; returns records accepted."""
    from eagle3_datagen.generate.windowed import run_windowed

    async with partition_runner(config, partition, url, budget) as (runner, batches, window):
        results = await run_windowed(iter(batches), runner.run_batch, window)
    failed = [r for r in results if isinstance(r, BaseException)]
    if failed:
        raise RuntimeError(f"{partition}: {len(failed)} batches failed, first: {failed[0]!r}")
    return sum(r.accepted for r in results if not isinstance(r, BaseException))


def run_child(module: str, args: list[str], timeout_s: float = 1800) -> dict[str, Any]:
    """Run ``python -m benchmarks.<module> ARGS`` in a fresh process; parse its last JSON line.

    Why a child: CPU time and the RSS high-water mark are per process, so each measured side
    gets a process of its own.
    """
    cmd = [sys.executable, "-m", f"benchmarks.{module}", *args]
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, cwd=REPO, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"{module} {args} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    last = proc.stdout.strip().splitlines()[-1]
    data: dict[str, Any] = json.loads(last)
    return data


def emit(result: dict[str, Any]) -> None:
    """A child's result: one JSON line on stdout, read by :func:`run_child`."""
    print(json.dumps(result), flush=True)


def run_async(coro: Any) -> Any:
    return asyncio.run(coro)


def render_partition(config: Any, partition: str) -> list[tuple[str, list[int]]]:
    """(id, prompt ids) of every line: the seed renders a whole partition before sending."""
    from eagle3_datagen.inputs.prompts import Prompt, parse_prompt, plan_batches, read_batch
    from eagle3_datagen.render.chat_tokenizer import ChatTokenizer

    tok = ChatTokenizer(config.model.tokenizer_dir)
    jobs: list[tuple[str, list[int]]] = []
    for spec in plan_batches(partition, config.partition(partition).input, 4096):
        parsed = [parse_prompt(raw, line) for line, raw in read_batch(spec)]
        ok = [p for p in parsed if isinstance(p, Prompt)]
        for p, rendered in zip(ok, tok.render(ok), strict=True):
            if isinstance(rendered, list):
                jobs.append((p.id, rendered))
    return jobs


def sampling_for(config: Any, tier: str) -> dict[str, Any]:
    """The pipeline's sampling parameters for ``tier`` (same stop ids, same max_new_tokens)."""
    from eagle3_datagen.render.chat_tokenizer import ChatTokenizer
    from eagle3_datagen.render.token_ids import TokenIds

    ids = TokenIds.resolve(ChatTokenizer(config.model.tokenizer_dir), config.special_tokens)
    params: dict[str, Any] = config.sampling.to_sglang(
        config.tier(tier).max_tokens, list(ids.stop_ids)
    )
    return params


async def bare_generate(
    session: Any,
    url: str,
    jobs: list[tuple[str, list[int]]],
    sampling: dict[str, Any],
    concurrency: int,
) -> list[int]:
    """The seed's loop: a semaphore, ``POST /generate`` with input_ids; returns output lengths."""
    import orjson

    sem = asyncio.Semaphore(concurrency)
    headers = {"Content-Type": "application/json"}

    async def one(rid: str, input_ids: list[int]) -> int:
        body = orjson.dumps({"input_ids": input_ids, "sampling_params": sampling, "rid": rid})
        async with sem, session.post(f"{url}/generate", data=body, headers=headers) as r:
            data = orjson.loads(await r.read())
            if r.status != 200:
                raise RuntimeError(f"HTTP {r.status}: {data}")
        return len(data["output_ids"])

    return list(await asyncio.gather(*(one(rid, ids) for rid, ids in jobs)))
