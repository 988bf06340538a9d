"""(e) ``concurrency: auto`` against a sweep of static concurrencies, on each physics profile.

For every profile (``sglang_emulator/physics.py``) one emulator runs with ``--emu-physics``,
time-scaled (``--emu-time-scale``), and the same workload is sent under each static
concurrency of the sweep and under the auto controller (``sglang/concurrency.py`` over
``ServerBudget``, reading the emulator's ``/metrics``, as a run does). Requests go through
``generate_with_retries`` and ``SGLangClient`` like the pipeline's; prompts are token ids
(~1,000 tokens), so nothing but the server's behaviour differs between runs.

What is measured: the server's output rate while it is loaded, in simulated tokens per second,
from the emulator's own token and simulated-time counters, between ``warmup_sim_s`` and
``end_sim_s`` of simulated server time (the slow start of auto and the ramp of every static
value are inside the warm-up; the final drain, the same for any policy and set by the longest
outputs, is left out). There are always more prompts than a run can start (checked), so no
policy runs out of work. Each run is cancelled at the end, the emulator drains, and the next
one starts on the same server. ``auto / best static`` is the
figure; ``auto / seed`` compares with the seed's hand-tuned value for that workload (150 for
SHORT-like, 32 for LONG-like outputs).

The fourth profile, ``router``, is two ``seed-node`` emulators behind a round-robin front
(``tests/support/front.py``) whose ``/metrics`` is sglang-router's (``sgl_router_*``) and whose
``/v1/loads`` is 404, as a run attached to a router sees it: the controller finds no SGLang
series at the start and steers on the responses alone. Its rate is the sum of both servers'
(each its own simulated clock), and its static sweep counts requests across both. It runs at
time scale 0.005, not 0.0015: every request costs CPU in the client, the front and an emulator
(the emulator makes each answer's ids and text before it queues it), and at 0.0015 two servers
finish ~450 requests a second, more than two shared cores carry: py-spy showed all four
processes busy and the servers holding 20-40 running of the 256 in flight each (the rest waited
in the HTTP layers), so the sweep measured the machine, not the policy, and on a loaded machine
a run could sit for minutes with both servers idle, their simulated clocks stopped. A run whose
servers do no simulated work for ``STALL_S`` now stops with what the servers and requests were
doing, instead of waiting.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from benchmarks.common import TOKENIZER_DIR, Emulator, emit, run_async
from tests.support.front import FrontProcess


@dataclass(frozen=True)
class Workload:
    profile: str
    prompts: int
    max_new: int
    statics: tuple[int, ...]
    seed_static: int
    time_scale: float
    warmup_sim_s: float = 400.0
    end_sim_s: float = 2400.0
    prompt_tokens: int = 1000
    physics: str = ""  # --emu-physics (default: the profile's name)
    servers: int = 1  # more than one: behind a round-robin front with a router's /metrics


WORKLOADS = {
    "seed-node": Workload("seed-node", 2400, 10240, (32, 64, 150, 256, 400), 150, 0.0015),
    "kv-poor": Workload("kv-poor", 2000, 10240, (32, 64, 100, 150, 256), 150, 0.0015),
    "reasoning": Workload("reasoning", 1200, 16384, (16, 32, 64, 96, 150), 32, 0.0015),
    "router": Workload(
        "router",
        6400,
        10240,
        (128, 300, 512),
        300,
        0.005,
        physics="seed-node",
        servers=2,
    ),
}


@dataclass
class RunResult:
    policy: str
    tok_s: float  # simulated output tokens per second while loaded
    retracted: int
    wall_s: float
    limits: list[int] = field(default_factory=list)


class _Counting:
    """A GenerateClient that counts requests handed to the server and fires at thresholds."""

    def __init__(self, inner: Any, marks: dict[int, asyncio.Event]) -> None:
        self.inner = inner
        self.marks = marks
        self.started = 0

    async def generate(self, request: Any) -> Any:
        self.started += 1
        mark = self.marks.get(self.started)
        if mark is not None:
            mark.set()
        return await self.inner.generate(request)


async def _stats(session: aiohttp.ClientSession, url: str) -> dict[str, Any]:
    for attempt in range(3):  # a loaded machine: a kept-alive connection the server just closed
        try:
            async with session.get(f"{url}/emulator/stats") as r:
                data: dict[str, Any] = orjson.loads(await r.read())
                return data
        except aiohttp.ClientConnectionError:
            if attempt == 2:
                raise
            await asyncio.sleep(0.1)
    raise AssertionError("unreachable")


async def _all_stats(session: aiohttp.ClientSession, urls: list[str]) -> list[dict[str, Any]]:
    return list(await asyncio.gather(*(_stats(session, u) for u in urls)))


def _rate(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> float:
    """Simulated output tokens per simulated second, summed over the servers (each has its own
    clock; all of them are loaded in the window)."""
    return sum(
        (y["physics"]["generated_tokens"] - x["physics"]["generated_tokens"])
        / (y["physics"]["sim_s"] - x["physics"]["sim_s"])
        for x, y in zip(a, b, strict=True)
    )


STALL_S = 60.0  # no simulated work on any server for this long: stop, do not wait forever


async def _window(
    session: aiohttp.ClientSession,
    servers: list[str],
    w: Workload,
    tasks: list[asyncio.Task[Any]],
    what: str,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The servers' stats at ``warmup_sim_s`` and ``end_sim_s`` of simulated work on each.

    A server's simulated clock moves only while it works, so a run whose requests stop
    reaching the servers (all failed, or stuck before them) would wait here forever: after
    ``STALL_S`` without simulated work anywhere it stops, naming what the servers and the
    requests were doing."""
    base = [s["physics"]["sim_s"] for s in await _all_stats(session, servers)]
    a = None
    last, moved = base, time.monotonic()
    while True:
        await asyncio.sleep(0.05)
        now = await _all_stats(session, servers)
        clocks = [s["physics"]["sim_s"] for s in now]
        if clocks != last:
            last, moved = clocks, time.monotonic()
        elif time.monotonic() - moved > STALL_S or all(t.done() for t in tasks):
            failed = [t.exception() for t in tasks if t.done() and not t.cancelled()]
            errors = [e for e in failed if e is not None]
            raise RuntimeError(
                f"{what}: no simulated work for {time.monotonic() - moved:.0f} s; servers "
                f"(running, queued) {[(s['running'], s['queued']) for s in now]}; requests "
                f"done {sum(t.done() for t in tasks)}/{len(tasks)}, failed {len(errors)}"
                + (f", first: {errors[0]!r}" if errors else "")
            )
        sim = min(c - b0 for c, b0 in zip(clocks, base, strict=True))
        if a is None and sim >= w.warmup_sim_s:
            a = now
        elif a is not None and sim >= w.end_sim_s:
            return a, now


async def one_run(
    url: str,
    w: Workload,
    prompts: list[list[int]],
    policy: int | str,
    interval_s: float,
    servers: list[str] | None = None,
) -> RunResult:
    """One policy's run against ``url`` (the emulator, or the front over ``servers``)."""
    from eagle3_datagen.config import AutoConcurrency, RetryPolicy
    from eagle3_datagen.sglang.budget import ServerBudget
    from eagle3_datagen.sglang.client import SGLangClient
    from eagle3_datagen.sglang.concurrency import ConcurrencyController
    from eagle3_datagen.sglang.load import LoadReader
    from eagle3_datagen.sglang.requests import generate_with_retries

    servers = servers or [url]
    n = len(prompts)
    budget = ServerBudget()
    controller = None
    slots = None
    if policy == "auto":
        settings = AutoConcurrency(interval_s=interval_s)
        controller = ConcurrencyController(budget, LoadReader([url]), settings)
    else:
        assert isinstance(policy, int)
        slots = asyncio.Semaphore(policy)
    retry = RetryPolicy(max_attempts=3, backoff_initial_s=0.1, backoff_max_s=0.5)
    sampling = {"max_new_tokens": w.max_new}
    async with (
        SGLangClient(url, timeout_s=3600, max_connections=2100) as raw,
        aiohttp.ClientSession() as session,
    ):
        client = _Counting(raw, {})
        t0 = time.monotonic()
        tasks = [
            asyncio.create_task(
                generate_with_retries(
                    client,
                    ids,
                    sampling,
                    rid=f"{policy}-{i}",
                    policy=retry,
                    slots=slots,
                    budget=budget,
                    share="bench",
                )
            )
            for i, ids in enumerate(prompts)
        ]
        a, b = await _window(session, servers, w, tasks, f"{w.profile} {policy}")
        if client.started >= n:
            raise RuntimeError(f"{w.profile} {policy}: all {n} prompts started; raise --scale")
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if controller is not None:
            await controller.aclose()
        while True:  # let the servers drain the cancelled requests before the next run
            now = await _all_stats(session, servers)
            if all(s["running"] == 0 and s["queued"] == 0 for s in now):
                break
            await asyncio.sleep(0.05)
    assert a is not None
    # Simulated seconds of server work, not wall time / scale: immune to the emulator's own
    # lag behind the scaled clock on a busy machine (the servers are never idle in the window).
    tok_s = _rate(a, b)
    retracted = sum(
        y["physics"]["retracted"] - x["physics"]["retracted"] for x, y in zip(a, b, strict=True)
    )
    limits = [d.limit for d in controller.history] if controller is not None else []
    wall = time.monotonic() - t0
    return RunResult(str(policy), tok_s, retracted, wall, limits)


async def bench_profile(w: Workload, interval_s: float, statics: tuple[int, ...]) -> dict[str, Any]:
    from benchmarks.emulator_ceiling import make_prompt
    from sglang_emulator.vocab import Vocab

    vocab = Vocab(TOKENIZER_DIR)
    prompts = [make_prompt(vocab, w.prompt_tokens, i) for i in range(w.prompts)]
    flags = [
        "--emu-physics",
        w.physics or w.profile,
        "--emu-time-scale",
        str(w.time_scale),
        "--enable-metrics",
    ]
    results: list[RunResult] = []
    policies: list[int | str] = [*statics, "auto"]
    with contextlib.ExitStack() as stack:
        emus = [stack.enter_context(Emulator(*flags)) for _ in range(w.servers)]
        servers = [e.url for e in emus]
        url = servers[0]
        if w.servers > 1:
            log = Path(tempfile.mkdtemp(prefix="front-")) / "front.log"
            url = stack.enter_context(FrontProcess(servers, log)).url
        for policy in policies:
            results.append(await one_run(url, w, prompts, policy, interval_s, servers))
        lag = max(e.stats()["physics"]["lag_s"] for e in emus)
    static = {r.policy: r for r in results if r.policy != "auto"}
    auto = next(r for r in results if r.policy == "auto")
    best = max(static.values(), key=lambda r: r.tok_s)
    seed = static.get(str(w.seed_static))
    return {
        "profile": w.profile,
        "servers": w.servers,
        "time_scale": w.time_scale,
        "prompts": w.prompts,
        "runs": [r.__dict__ for r in results],
        "best_static": best.policy,
        "best_static_tok_s": best.tok_s,
        "auto_tok_s": auto.tok_s,
        "auto_vs_best": auto.tok_s / best.tok_s,
        "seed_static": w.seed_static,
        "auto_vs_seed": auto.tok_s / seed.tok_s if seed else None,
        "auto_final_limit": auto.limits[-1] if auto.limits else None,
        "auto_retracted": auto.retracted,
        "emulator_max_lag_s": lag,
    }


DEFAULT_PROFILES = ("seed-node", "kv-poor", "reasoning", "router")


def measure(scale: float = 1.0, interval_s: float = 0.02) -> dict[str, Any]:
    """Every default profile's sweep and auto run (what ``run_all`` reports as figure (e))."""
    out = []
    for w in (WORKLOADS[name] for name in DEFAULT_PROFILES):
        if scale < 1:  # smoke runs: one profile, two static values, a short window
            f = max(scale, 0.05)
            # 4,000 prompts: more than auto's 2,048 ceiling can start, so the window ends with
            # prompts still waiting on a fast machine too (1,000 all started on a quiet one).
            w = Workload(
                **{
                    **w.__dict__,
                    "prompts": max(4000, round(w.prompts * f)),
                    "warmup_sim_s": w.warmup_sim_s * f,
                    "end_sim_s": w.end_sim_s * f,
                    "statics": (32, w.seed_static),
                }
            )
        out.append(run_async(bench_profile(w, interval_s, w.statics)))
        if scale < 1:
            break
    return {"profiles": out, "interval_s": interval_s}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--profiles", default=",".join(DEFAULT_PROFILES), help="router: see above")
    ap.add_argument("--scale", type=float, default=1.0, help="multiply the prompt counts")
    ap.add_argument("--interval-s", type=float, default=0.02, help="controller reading interval")
    args = ap.parse_args(argv)
    out = []
    for name in args.profiles.split(","):
        w = WORKLOADS[name]
        w = Workload(**{**w.__dict__, "prompts": max(100, round(w.prompts * args.scale))})
        out.append(run_async(bench_profile(w, args.interval_s, w.statics)))
    emit({"profiles": out})


if __name__ == "__main__":
    main()
