"""(b) How busy the server's slots stay: partitions side by side against one after another.

Why: GPU time is the expensive resource. The seed ran partitions one after another, so the
server drained at every partition boundary (the last long generations of a partition run with
most slots idle). The pipeline runs partitions side by side, as the parent flow does, so the
server drains once, at the very end.

The emulator's latency model stands in for the GPU: a fixed number of running slots (the rest
queue, FIFO), prefill time per prompt token, decode time per output token, long-tailed
(lognormal) output lengths. Utilization = slot-busy-seconds / (slots x wall), from
``/emulator/stats``, counted from the first request to the last answer.

- **pipeline**: three partitions with different tiers, ``run_partition`` for each at once
  (``PartitionRunner`` + ``run_windowed``, one client per partition, one shared
  ``ServerBudget``), the parent flow's scheduling without Prefect.
- **sequential**: the same partitions one after another with the seed's bare loop (prompts
  rendered before the clock starts, a semaphore of the tier's concurrency): the strongest form
  of the seed's way.
- **budget**: a LONG and a SHORT partition side by side under ``server.limits.max_tokens_in_flight``
  (prompt + max_tokens reserved per request); the budget's peak must stay under its cap. The
  same two partitions without the cap give the utilization to compare with.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from benchmarks.common import (
    Emulator,
    bare_generate,
    emit,
    make_config,
    render_partition,
    run_child,
    run_partition,
    sampling_for,
    write_prompts,
)

# Three tiers, each able to fill the server on its own (concurrency >= slots): what is measured
# is the scheduling across partitions, not a tier too small for the server.
TIERS = [("SHORT", 150, 1024), ("MEDIUM", 64, 2048), ("LONG", 32, 4096)]
BUDGET_TIERS = [("SHORT", 150, 1024), ("LONG", 32, 4096)]


@dataclass(frozen=True)
class Scenario:
    """Server shape and workload size."""

    slots: int = 32
    decode_ms: float = 1.0
    prefill_tok_s: float = 50_000.0
    mean_output: int = 200
    sigma: float = 1.0
    prompts: tuple[int, int, int] = (4500, 3000, 1500)  # SHORT, MEDIUM, LONG partitions
    budget_prompts: tuple[int, int] = (6000, 2000)  # SHORT, LONG under the token budget
    # Binding (the tiers alone would reserve ~330k) yet >= slots x the largest reservation
    # (32 x ~4350), so the server can stay full whatever mix of requests the FIFO admits.
    max_tokens_in_flight: int = 160_000

    def emulator_flags(self) -> list[str]:
        return [
            "--emu-running-slots",
            str(self.slots),
            "--emu-decode-ms-per-token",
            str(self.decode_ms),
            "--emu-prefill-tokens-per-s",
            str(self.prefill_tok_s),
            "--emu-mean-output-tokens",
            str(self.mean_output),
            "--emu-output-sigma",
            str(self.sigma),
        ]


def _stats(url: str, path: str, method: str = "GET") -> dict[str, Any]:
    response = httpx.request(method, f"{url}{path}", timeout=30)
    response.raise_for_status()
    data: dict[str, Any] = response.json()
    return data


def _config(
    parts: list[tuple[str, Path, str]],
    out: Path,
    tiers: list[tuple[str, int, int]],
    max_tokens: int | None = None,
) -> Any:
    return make_config(parts, out, tiers=tiers, max_tokens=max_tokens)


async def _side_by_side(config: Any, url: str) -> dict[str, Any]:
    from eagle3_datagen.render.chat_tokenizer import ChatTokenizer
    from eagle3_datagen.sglang.budget import ServerBudget

    ChatTokenizer(config.model.tokenizer_dir)  # loaded once per process, before the clock
    budget = ServerBudget(
        config.server.limits.max_requests_in_flight, config.server.limits.max_tokens_in_flight
    )
    _stats(url, "/emulator/reset_stats", "POST")
    t0 = time.monotonic()
    done = await asyncio.gather(
        *(run_partition(config, p.name, url, budget) for p in config.partitions)
    )
    wall = time.monotonic() - t0
    stats = _stats(url, "/emulator/stats")
    return {
        "stats": stats,
        "wall_s": wall,
        "accepted": sum(done),
        "peak_tokens": budget.peak_tokens,
        "peak_requests": budget.peak_requests,
        "max_tokens_in_flight": config.server.limits.max_tokens_in_flight,
    }


async def _sequential(config: Any, url: str) -> dict[str, Any]:
    import aiohttp

    plans = []
    for part in config.partitions:  # rendered before the clock: the strongest baseline
        tier = config.tier(part.tier)
        plans.append(
            (
                render_partition(config, part.name),
                sampling_for(config, tier.name),
                tier.in_flight_cap,
            )
        )
    connector = aiohttp.TCPConnector(limit=max(c for *_, c in plans) + 8)
    async with aiohttp.ClientSession(connector=connector) as session:
        _stats(url, "/emulator/reset_stats", "POST")
        t0 = time.monotonic()
        done = 0
        for jobs, sampling, concurrency in plans:
            done += len(await bare_generate(session, url, jobs, sampling, concurrency))
        wall = time.monotonic() - t0
    stats = _stats(url, "/emulator/stats")
    return {"stats": stats, "wall_s": wall, "accepted": done}


def _partitions(
    tmp: Path, sizes: tuple[int, ...], tiers: list[tuple[str, int, int]], prefix: str = "part"
) -> list[tuple[str, Path, str]]:
    """One prompts file per tier; different prompts in each, so different outputs."""
    parts = []
    first = 0
    for (tier, _, _), n in zip(tiers, sizes, strict=True):
        name = f"{prefix}_{tier.lower()}"
        parts.append((name, write_prompts(tmp / f"{name}.jsonl", n, first=first), tier))
        first += n
    return parts


def measure(sc: Scenario) -> dict[str, Any]:
    """Side by side, sequential and budgeted runs, each on a fresh emulator, in child processes."""
    tmp = Path(tempfile.mkdtemp(prefix="bench-b-"))
    try:
        parts = _partitions(tmp, sc.prompts, TIERS)
        budget_parts = _partitions(tmp, sc.budget_prompts, BUDGET_TIERS, prefix="budget")
        runs: dict[str, dict[str, Any]] = {}
        for mode, these, tiers, cap in (
            ("pipeline", parts, TIERS, None),
            ("sequential", parts, TIERS, None),
            ("budget", budget_parts, BUDGET_TIERS, sc.max_tokens_in_flight),
            # A cap that never binds: the budget only counts, to show what was reserved.
            ("unbudgeted", budget_parts, BUDGET_TIERS, 10**12),
        ):
            spec = tmp / f"{mode}.json"
            spec.write_text(_spec_json(these, tmp / f"out-{mode}", tiers, cap))
            with Emulator(*sc.emulator_flags()) as emu:
                child_mode = "pipeline" if mode in ("budget", "unbudgeted") else mode
                runs[mode] = run_child("utilization", [child_mode, emu.url, str(spec)])
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    pipe, seq, bud, free = (runs[k] for k in ("pipeline", "sequential", "budget", "unbudgeted"))

    def nominal(stats: dict[str, Any]) -> float:
        """Utilization from the work done (token counts x the latency model), not the timers:
        on a shared 2-core machine the emulator's sleeps run late when the CPU is busy."""
        busy = (
            stats["prompt_tokens"] / sc.prefill_tok_s + stats["output_tokens"] * sc.decode_ms / 1e3
        )
        return float(busy / (sc.slots * stats["elapsed_s"]))

    return {
        "pipeline_nominal": nominal(pipe["stats"]),
        "sequential_nominal": nominal(seq["stats"]),
        "budget_nominal": nominal(bud["stats"]),
        "unbudgeted_utilization": free["stats"]["slot_utilization"],
        "unbudgeted_peak_tokens": free["peak_tokens"],
        "slots": sc.slots,
        "decode_ms": sc.decode_ms,
        "prompts": sum(sc.prompts),
        "pipeline_utilization": pipe["stats"]["slot_utilization"],
        "sequential_utilization": seq["stats"]["slot_utilization"],
        "pipeline_wall_s": pipe["stats"]["elapsed_s"],
        "sequential_wall_s": seq["stats"]["elapsed_s"],
        "pipeline_accepted": pipe["accepted"],
        "budget_utilization": bud["stats"]["slot_utilization"],
        "budget_peak_tokens": bud["peak_tokens"],
        "budget_peak_requests": bud["peak_requests"],
        "budget_cap_tokens": bud["max_tokens_in_flight"],
        "budget_peak_running": bud["stats"]["peak_running"],
    }


def _spec_json(
    parts: list[tuple[str, Path, str]],
    out: Path,
    tiers: list[tuple[str, int, int]],
    cap: int | None,
) -> str:
    import json

    return json.dumps(
        {
            "parts": [[n, str(p), t] for n, p, t in parts],
            "out": str(out),
            "tiers": tiers,
            "cap": cap,
        }
    )


def main(argv: list[str]) -> None:
    import json

    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=["pipeline", "sequential"])
    p.add_argument("url")
    p.add_argument("spec", type=Path)
    args = p.parse_args(argv)
    spec = json.loads(args.spec.read_text())
    parts = [(n, Path(f), t) for n, f, t in spec["parts"]]
    config = _config(parts, Path(spec["out"]), [tuple(t) for t in spec["tiers"]], spec["cap"])
    if args.mode == "sequential":
        emit(asyncio.run(_sequential(config, args.url)))
    else:
        emit(asyncio.run(_side_by_side(config, args.url)))


if __name__ == "__main__":
    main(sys.argv[1:])
