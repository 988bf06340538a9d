"""Client CPU per ``/generate`` call for each HTTP stack: why ``SGLangClient`` uses aiohttp.

    uv run python benchmarks/transports.py [--requests 3000]

Each stack runs in a fresh child process against the same zero-latency emulator, 150 requests
in flight, the same ~250-token prompts and ~200-token answers; CPU is the child's own
(``getrusage``), over the timed requests only. Also prints the cost of decoding one answer
with ``json`` and with ``orjson``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import TOKENIZER_DIR, Emulator, cpu_s, emit, run_child

STACKS = {
    "httpx (native transport)": "httpx",
    "httpx + httpx-aiohttp": "httpx_aiohttp",
    "aiohttp + json (the seed's loop)": "aiohttp_json",
    "aiohttp + orjson": "aiohttp_orjson",
    "SGLangClient.generate (aiohttp + orjson)": "client",
}
SAMPLING = {
    "max_new_tokens": 1024,
    "temperature": 1.0,
    "top_p": 0.95,
    "skip_special_tokens": False,
    "no_stop_trim": True,
}


async def _stack(kind: str, url: str, n: int, concurrency: int) -> dict[str, Any]:
    import aiohttp
    import httpx
    import orjson

    from benchmarks.emulator_ceiling import make_prompt
    from eagle3_datagen.sglang.client import GenerateRequest, SGLangClient
    from sglang_emulator.vocab import Vocab

    vocab = Vocab(TOKENIZER_DIR)
    prompts = [make_prompt(vocab, 250, i) for i in range(256)]
    limits = httpx.Limits(max_connections=concurrency + 8, max_keepalive_connections=concurrency)
    closers: list[Callable[[], Awaitable[Any]]] = []
    send: Callable[[int], Awaitable[int]]

    def payload(i: int) -> dict[str, Any]:
        return {"input_ids": prompts[i % 256], "sampling_params": SAMPLING, "rid": f"r{i}"}

    if kind in ("httpx", "httpx_aiohttp"):
        if kind == "httpx_aiohttp":
            from httpx_aiohttp import AiohttpTransport

            transport: Any = AiohttpTransport(limits=limits, trust_env=False)
        else:
            transport = httpx.AsyncHTTPTransport(limits=limits, trust_env=False)
        client = httpx.AsyncClient(base_url=url, transport=transport, timeout=60)
        closers.append(client.aclose)

        async def send(i: int) -> int:
            r = await client.post(
                "/generate",
                content=orjson.dumps(payload(i)),
                headers={"Content-Type": "application/json"},
            )
            return len(orjson.loads(r.content)["output_ids"])

    elif kind in ("aiohttp_json", "aiohttp_orjson"):
        session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency + 8))
        closers.append(session.close)
        fast = kind == "aiohttp_orjson"

        async def send(i: int) -> int:
            if fast:
                body = orjson.dumps(payload(i))
                headers = {"Content-Type": "application/json"}
                async with session.post(f"{url}/generate", data=body, headers=headers) as r:
                    data = orjson.loads(await r.read())
            else:
                async with session.post(f"{url}/generate", json=payload(i)) as r:
                    data = await r.json()
            return len(data["output_ids"])

    else:
        sg = SGLangClient(url, max_connections=concurrency + 8)
        closers.append(sg.aclose)

        async def send(i: int) -> int:
            p = payload(i)
            return len(
                (await sg.generate(GenerateRequest(p["input_ids"], SAMPLING, p["rid"]))).output_ids
            )

    sem = asyncio.Semaphore(concurrency)

    async def one(i: int) -> int:
        async with sem:
            return await send(i)

    await asyncio.gather(*(one(i) for i in range(2 * concurrency)))  # warm-up, connections
    c0, t0 = cpu_s(), time.monotonic()
    tokens = sum(await asyncio.gather(*(one(i) for i in range(n))))
    cpu, wall = cpu_s() - c0, time.monotonic() - t0
    for close in closers:
        await close()
    return {"cpu_ms": cpu / n * 1e3, "rate": n / wall, "tokens": tokens / n}


def json_decode_us() -> dict[str, float]:
    """Decoding one ~200-token /generate answer: stdlib json against orjson."""
    import orjson

    meta = {
        "id": "r",
        "prompt_tokens": 250,
        "completion_tokens": 200,
        "finish_reason": {"type": "stop", "matched": 7},
    }
    answer = {"text": "x" * 900, "output_ids": list(range(150_000, 150_200)), "meta_info": meta}
    body = json.dumps(answer).encode()
    out = {}
    for name, loads in (("json", json.loads), ("orjson", orjson.loads)):
        c0 = time.process_time()
        for _ in range(20_000):
            loads(body)
        out[name] = (time.process_time() - c0) / 20_000 * 1e6
    return out


def measure(n: int, concurrency: int = 150) -> dict[str, Any]:
    import importlib.util

    rows = {}
    with Emulator("--emu-mean-output-tokens", "200", "--emu-output-sigma", "0") as emu:
        for label, kind in STACKS.items():
            if kind == "httpx_aiohttp" and importlib.util.find_spec("httpx_aiohttp") is None:
                continue  # not installed
            n_kind = max(300, n // 5) if kind == "httpx" else n  # ~5 ms a request: fewer
            rows[label] = run_child(
                "transports", ["child", kind, emu.url, str(n_kind), str(concurrency)]
            )
    return {"stacks": rows, "json_us": json_decode_us()}


def main(argv: list[str]) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    sub = p.add_subparsers(dest="mode")
    c = sub.add_parser("child")
    c.add_argument("kind")
    c.add_argument("url")
    c.add_argument("n", type=int)
    c.add_argument("concurrency", type=int)
    p.add_argument("--requests", type=int, default=3000)
    args = p.parse_args(argv)
    if args.mode == "child":
        emit(asyncio.run(_stack(args.kind, args.url, args.n, args.concurrency)))
        return
    result = measure(args.requests)
    print(f"{'stack':52} {'CPU/request':>12} {'req/s':>8}")
    for label, row in result["stacks"].items():
        print(f"{label:52} {row['cpu_ms']:9.2f} ms {row['rate']:8,.0f}")
    js = result["json_us"]
    print(f"decoding one answer: json {js['json']:.0f} us, orjson {js['orjson']:.0f} us")


if __name__ == "__main__":
    main(sys.argv[1:])
