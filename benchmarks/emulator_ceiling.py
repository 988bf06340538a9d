"""Measure the emulator's own ceiling: req/s with a raw aiohttp client and no latency model.

``uv run python -m benchmarks.emulator_ceiling [--concurrency 150] [--output-tokens 200]``
starts an emulator subprocess on a free port (or uses ``--url``), keeps ``concurrency`` requests
in flight for ``--seconds``, and prints the rate. The client shares the machine, so the number
is a floor of the server's ceiling; the server's own CPU time per request (from ``/proc``)
gives the ceiling of one emulator core.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import time
from pathlib import Path

import aiohttp
import orjson

from sglang_emulator.vocab import Vocab
from tests.support import TOKENIZER_DIR
from tests.support.emulator import EmulatorProcess


def make_prompt(vocab: Vocab, n_tokens: int, seed: int) -> list[int]:
    """A chat-shaped prompt of about ``n_tokens`` ids ending in the generation prompt."""
    sp = vocab.special
    rng = random.Random(seed)
    body = rng.choices(vocab.word_pool, k=max(1, n_tokens - 8))
    head = [sp["im_user"], *vocab.encode("user"), sp["im_middle"]] if "im_user" in sp else []
    tail = [sp[k] for k in ("im_end", "im_assistant") if k in sp]
    tail += [*vocab.encode("assistant"), *([sp["im_middle"], sp["think"]] if "think" in sp else [])]
    return head + body + tail


async def bench(
    url: str, prompts: list[list[int]], concurrency: int, output_tokens: int, seconds: float
) -> tuple[int, int, float]:
    """Closed loop of ``concurrency`` workers; returns (requests, output tokens, seconds)."""
    bodies = [
        orjson.dumps(
            {
                "input_ids": p,
                "sampling_params": {"max_new_tokens": output_tokens, "ignore_eos": True},
            }
        )
        for p in prompts
    ]
    done = 0
    tokens = 0
    connector = aiohttp.TCPConnector(limit=concurrency)
    headers = {"Content-Type": "application/json"}
    async with aiohttp.ClientSession(connector=connector) as session:
        stop_at = time.monotonic() + seconds

        async def worker(w: int) -> None:
            nonlocal done, tokens
            i = w
            while time.monotonic() < stop_at:
                body = bodies[i % len(bodies)]
                i += concurrency
                async with session.post(f"{url}/generate", data=body, headers=headers) as r:
                    data = orjson.loads(await r.read())
                    if r.status != 200:
                        raise RuntimeError(f"HTTP {r.status}: {data}")
                done += 1
                tokens += len(data["output_ids"])

        t0 = time.monotonic()
        await asyncio.gather(*(worker(w) for w in range(concurrency)))
        return done, tokens, time.monotonic() - t0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--model-path", default=str(TOKENIZER_DIR))
    p.add_argument("--url", default=None, help="bench a running emulator instead of starting one")
    p.add_argument("--concurrency", type=int, default=150)
    p.add_argument("--output-tokens", type=int, default=200)
    p.add_argument("--prompt-tokens", type=int, default=1000)
    p.add_argument("--seconds", type=float, default=5.0)
    p.add_argument("--warmup-seconds", type=float, default=1.0)
    args = p.parse_args(argv)

    vocab = Vocab(Path(args.model_path))
    prompts = [make_prompt(vocab, args.prompt_tokens, i) for i in range(256)]
    emu = None if args.url else EmulatorProcess(model_path=Path(args.model_path)).wait_ready()
    url: str = emu.url if emu is not None else args.url
    try:
        if args.warmup_seconds > 0:
            asyncio.run(
                bench(url, prompts, args.concurrency, args.output_tokens, args.warmup_seconds)
            )
        cpu0 = emu.cpu_s() if emu is not None else None
        n, toks, dt = asyncio.run(
            bench(url, prompts, args.concurrency, args.output_tokens, args.seconds)
        )
        cpu1 = emu.cpu_s() if emu is not None else None
    finally:
        if emu is not None:
            emu.stop()
    print(
        f"emulator self-bench: {n / dt:,.0f} req/s, {toks / dt:,.0f} output tok/s "
        f"({n} requests in {dt:.1f}s, {args.concurrency} in flight, "
        f"{args.prompt_tokens} prompt + {args.output_tokens} output tokens)"
    )
    if cpu0 is not None and cpu1 is not None and n:
        per_req = (cpu1 - cpu0) / n
        # The client shares the machine; the server's own CPU per request gives its ceiling.
        print(
            f"emulator CPU: {per_req * 1e6:,.0f} us per request, so one core serves at most "
            f"~{1 / per_req:,.0f} req/s"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
