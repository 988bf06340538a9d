"""(a) What the pipeline costs on the client, against a bare loop that only sends the requests.

Why: the GPU node costs far more than the client, so the pipeline's extra work (parsing,
rendering, validating, journaling, Parquet) must not slow the requests down or cost much CPU.

Both sides run as fresh child processes against the same zero-latency emulator, with the same
prompts and sampling parameters:

- **bare**: the seed's ``run_inference.py`` design: prompts rendered up front (not timed), then
  one aiohttp session, a semaphore of 150, ``POST /generate`` with ``input_ids``, orjson in
  and out, results kept in a list. No Prefect, no validation, no Parquet.
- **pipeline**: our data path at library level: ``PartitionRunner.run_batch`` over every batch
  through ``run_windowed``, exactly as the partition subflow drives it, minus Prefect. Timed:
  read + parse + render + request + validate + journal + Parquet.
- **flow** (optional): the real ``generate_partition`` Prefect subflow on a temporary Prefect
  server against the same runner code run directly; the difference per batch task is Prefect's
  cost.

CPU is ``getrusage(RUSAGE_SELF)`` of the child (all its threads), over the timed section only.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common import (
    Emulator,
    bare_generate,
    cpu_s,
    emit,
    make_config,
    render_partition,
    run_child,
    sampling_for,
    write_prompts,
)

ZERO_LATENCY = ("--emu-mean-output-tokens", "200", "--emu-output-sigma", "0")


def _emu_cpu(pid: int) -> float:
    """The emulator's CPU seconds (Linux /proc), to show it is not what limits the run."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _setup(prompts: Path, out: Path, batch_size: int = 512) -> tuple[Any, Any]:
    config = make_config([("bench", prompts, "SHORT")], out, batch_size=batch_size)
    return config, config.partition("bench")


async def _bare(url: str, prompts: Path, emu_pid: int, concurrency: int) -> dict[str, Any]:
    import aiohttp

    config, _ = _setup(prompts, Path(tempfile.gettempdir()))
    jobs = render_partition(config, "bench")  # before the clock, as the seed did
    sampling = sampling_for(config, "SHORT")
    connector = aiohttp.TCPConnector(limit=concurrency + 8)
    async with aiohttp.ClientSession(connector=connector) as session:
        warm = [(f"warm{i}", ids) for i, (_, ids) in enumerate(jobs[: 2 * concurrency])]
        await bare_generate(session, url, warm, sampling, concurrency)
        c0, e0, t0 = cpu_s(), _emu_cpu(emu_pid), time.monotonic()
        lengths = await bare_generate(session, url, jobs, sampling, concurrency)
        wall, cpu, emu = time.monotonic() - t0, cpu_s() - c0, _emu_cpu(emu_pid) - e0
    return {
        "records": len(lengths),
        "wall_s": wall,
        "cpu_s": cpu,
        "emu_cpu_s": emu,
        "output_tokens": sum(lengths),
    }


def _count_render_cpu(tokenizer: Any) -> list[float]:
    """Wrap ``tokenizer.render`` to add up its CPU: the part the bare loop does before its clock
    starts. (The Rust encoder's own worker threads, if it starts any, are not counted.)"""
    total = [0.0]
    render = tokenizer.render

    def counted(prompts: Any) -> Any:
        # The render runs on a worker thread (generate/offload.py): that thread's own CPU, so
        # the loop's work done meanwhile is not counted as rendering.
        c0 = time.thread_time()
        try:
            return render(prompts)
        finally:
            total[0] += time.thread_time() - c0

    tokenizer.render = counted
    return total


async def _pipeline(url: str, prompts: Path, out: Path, emu_pid: int) -> dict[str, Any]:
    from benchmarks.common import partition_runner
    from eagle3_datagen.generate.windowed import run_windowed
    from eagle3_datagen.inputs.prompts import Prompt, parse_prompt, read_batch
    from eagle3_datagen.sglang.client import GenerateRequest

    config, _ = _setup(prompts, out)
    async with partition_runner(config, "bench", url) as (runner, batches, window):
        # Warm-up outside the timed section: lazy imports, template compilation, connections.
        sample = [parse_prompt(raw, line) for line, raw in read_batch(batches[0])[:8]]
        runner.ctx.tokenizer.render([p for p in sample if isinstance(p, Prompt)])
        warm = [
            runner.sender.client.generate(
                GenerateRequest([1, 2, 3], runner.ctx.sampling, f"warm{i}")
            )
            for i in range(300)
        ]
        await asyncio.gather(*warm)
        render_cpu = _count_render_cpu(runner.ctx.tokenizer)
        c0, e0, t0 = cpu_s(), _emu_cpu(emu_pid), time.monotonic()
        results = await run_windowed(iter(batches), runner.run_batch, window)
        wall, cpu, emu = time.monotonic() - t0, cpu_s() - c0, _emu_cpu(emu_pid) - e0
    failed = [r for r in results if isinstance(r, BaseException)]
    if failed:
        raise RuntimeError(f"{len(failed)} batches failed: {failed[0]!r}")
    summaries = [r for r in results if not isinstance(r, BaseException)]
    return {
        "records": sum(s.accepted + s.rejected for s in summaries),
        "accepted": sum(s.accepted for s in summaries),
        "rejected": sum(s.rejected for s in summaries),
        "output_tokens": sum(s.output_tokens for s in summaries),
        "batches": len(summaries),
        "wall_s": wall,
        "cpu_s": cpu,
        "emu_cpu_s": emu,
        "render_cpu_s": render_cpu[0],
    }


def _flow(url: str, prompts: Path, out: Path, batch_size: int) -> dict[str, Any]:
    """The same partition through the library path, then through the Prefect subflow."""
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
    from prefect.testing.utilities import prefect_test_harness

    from benchmarks.common import run_partition
    from eagle3_datagen.render.chat_tokenizer import ChatTokenizer
    from eagle3_datagen_flows.partition import generate_partition

    config, _ = _setup(prompts, out / "lib", batch_size)
    ChatTokenizer(config.model.tokenizer_dir)  # loaded once per process, as in a flow run
    asyncio.run(run_partition(config, "bench", url))  # warm-up: imports, template, caches
    shutil.rmtree(out / "lib")

    c0, t0 = cpu_s(), time.monotonic()
    asyncio.run(run_partition(config, "bench", url))
    lib_wall, lib_cpu = time.monotonic() - t0, cpu_s() - c0

    flow_config, _ = _setup(prompts, out / "flow", batch_size)
    with prefect_test_harness(server_startup_timeout=180):
        # One warm-up flow run on another output dir, so the timed run is not the first.
        warm_config, _ = _setup(prompts, out / "warm", batch_size)
        asyncio.run(generate_partition(config=warm_config, partition="bench", server_url=url))
        c0, t0 = cpu_s(), time.monotonic()
        summary = asyncio.run(
            generate_partition(config=flow_config, partition="bench", server_url=url)
        )
        flow_wall, flow_cpu = time.monotonic() - t0, cpu_s() - c0
    return {
        "batches": summary["batches"],
        "records": summary["input_lines"],
        "lib_wall_s": lib_wall,
        "lib_cpu_s": lib_cpu,
        "flow_wall_s": flow_wall,
        "flow_cpu_s": flow_cpu,
    }


def measure(
    n_prompts: int, repeats: int, *, prefect: bool, flow_prompts: int, concurrency: int = 150
) -> dict[str, Any]:
    """Run bare and pipeline ``repeats`` times each, alternating; medians of each figure."""
    tmp = Path(tempfile.mkdtemp(prefix="bench-a-"))
    try:
        prompts = write_prompts(tmp / "prompts.jsonl", n_prompts)
        bare: list[dict[str, Any]] = []
        pipe: list[dict[str, Any]] = []
        flow: dict[str, Any] | None = None
        with Emulator(*ZERO_LATENCY) as emu:
            pid = str(emu.proc.pid)
            for r in range(repeats):
                bare.append(
                    run_child(
                        "client_overhead", ["bare", emu.url, str(prompts), pid, str(concurrency)]
                    )
                )
                out = tmp / f"out{r}"
                pipe.append(
                    run_child("client_overhead", ["pipeline", emu.url, str(prompts), str(out), pid])
                )
                shutil.rmtree(out, ignore_errors=True)
            if prefect:
                flow_in = write_prompts(tmp / "flow.jsonl", flow_prompts)
                flow = run_child(
                    "client_overhead", ["flow", emu.url, str(flow_in), str(tmp / "flow"), "64"]
                )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    def med(rows: list[dict[str, Any]], f: Any) -> float:
        return statistics.median(f(r) for r in rows)

    bare_rate = med(bare, lambda r: r["records"] / r["wall_s"])
    pipe_rate = med(pipe, lambda r: r["records"] / r["wall_s"])
    emu_us = med(bare + pipe, lambda r: r["emu_cpu_s"] / r["records"] * 1e6)
    result: dict[str, Any] = {
        "prompts": n_prompts,
        "repeats": repeats,
        "bare_rate": bare_rate,
        "pipeline_rate": pipe_rate,
        "throughput_ratio": pipe_rate / bare_rate,
        "bare_cpu_ms": med(bare, lambda r: r["cpu_s"] / r["records"] * 1e3),
        "pipeline_cpu_ms": med(pipe, lambda r: r["cpu_s"] / r["records"] * 1e3),
        "pipeline_rejected": max(r["rejected"] for r in pipe),
        "output_tokens_per_record": med(pipe, lambda r: r["output_tokens"] / r["accepted"]),
        "render_cpu_ms": med(pipe, lambda r: r["render_cpu_s"] / r["records"] * 1e3),
        "emulator_cpu_us": emu_us,
        "emulator_ceiling_rate": 1e6 / emu_us if emu_us else float("inf"),
    }
    if flow is not None:
        result["prefect_task_overhead_ms"] = (
            (flow["flow_wall_s"] - flow["lib_wall_s"]) / flow["batches"] * 1e3
        )
        result["prefect_task_cpu_ms"] = (
            (flow["flow_cpu_s"] - flow["lib_cpu_s"]) / flow["batches"] * 1e3
        )
        result["prefect_batches"] = flow["batches"]
        result["prefect_batch_size"] = 64
    return result


def main(argv: list[str]) -> None:
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="mode", required=True)
    b = sub.add_parser("bare")
    b.add_argument("url")
    b.add_argument("prompts", type=Path)
    b.add_argument("emu_pid", type=int)
    b.add_argument("concurrency", type=int)
    q = sub.add_parser("pipeline")
    q.add_argument("url")
    q.add_argument("prompts", type=Path)
    q.add_argument("out", type=Path)
    q.add_argument("emu_pid", type=int)
    f = sub.add_parser("flow")
    f.add_argument("url")
    f.add_argument("prompts", type=Path)
    f.add_argument("out", type=Path)
    f.add_argument("batch_size", type=int)
    args = p.parse_args(argv)
    if args.mode == "bare":
        emit(asyncio.run(_bare(args.url, args.prompts, args.emu_pid, args.concurrency)))
    elif args.mode == "pipeline":
        emit(asyncio.run(_pipeline(args.url, args.prompts, args.out, args.emu_pid)))
    else:
        emit(_flow(args.url, args.prompts, args.out, args.batch_size))


if __name__ == "__main__":
    main(sys.argv[1:])
