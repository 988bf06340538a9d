"""Read a server's load: SGLang's Prometheus ``/metrics``, or ``/v1/loads`` without it.

``/metrics`` exists only when SGLang runs with ``--enable-metrics`` (the run adds the flag when
it launches the server for a tier with ``concurrency: auto``); it has everything the
concurrency controller needs, retractions included (``sglang:num_retracted_requests_total``).
``/v1/loads`` is always served by SGLang 0.5.23 but has no retraction count. Several servers
(comma-separated URLs) are read one by one and summed.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import aiohttp
import orjson

# SGLang 0.5.23 metric names (sglang/srt/observability/metrics_collector.py).
_NAMES = {
    "sglang:num_running_reqs": "running",
    "sglang:num_queue_reqs": "queued",
    "sglang:num_used_tokens": "used_tokens",
    "sglang:token_usage": "token_usage",
    "sglang:gen_throughput": "gen_throughput",
    "sglang:num_retracted_requests_total": "retracted_total",
}


@dataclass(frozen=True)
class LoadSample:
    """One reading of the server(s): requests running and waiting, KV use, rate, retractions.

    ``retracted_total`` is None where the server does not report it (no ``/metrics``).
    """

    running: int
    queued: int
    token_usage: float
    gen_throughput: float
    retracted_total: int | None


def parse_metrics(text: str) -> LoadSample:
    """The load from a Prometheus text body; series of one name (DP ranks) are summed, the
    token usage is their maximum."""
    sums: dict[str, float] = {}
    usage = 0.0
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        name_labels, _, value = line.rpartition(" ")
        name = name_labels.partition("{")[0]
        key = _NAMES.get(name)
        if key is None:
            continue
        try:
            v = float(value)
        except ValueError:
            continue
        if key == "token_usage":
            usage = max(usage, v)
        else:
            sums[key] = sums.get(key, 0.0) + v
    if "running" not in sums:
        raise ValueError("no sglang:num_running_reqs in /metrics")
    retracted = sums.get("retracted_total")
    return LoadSample(
        running=int(sums.get("running", 0)),
        queued=int(sums.get("queued", 0)),
        token_usage=usage,
        gen_throughput=sums.get("gen_throughput", 0.0),
        retracted_total=None if retracted is None else int(retracted),
    )


def parse_loads(body: bytes) -> LoadSample:
    """The load from a ``/v1/loads`` JSON body (no retraction count there)."""
    loads = orjson.loads(body)["loads"]
    return LoadSample(
        running=sum(int(x.get("num_running_reqs", 0)) for x in loads),
        queued=sum(int(x.get("num_waiting_reqs", 0)) for x in loads),
        token_usage=max((float(x.get("token_usage", 0.0)) for x in loads), default=0.0),
        gen_throughput=sum(float(x.get("gen_throughput", 0.0)) for x in loads),
        retracted_total=None,
    )


def combine(samples: list[LoadSample]) -> LoadSample:
    """Several servers as one: counts summed, the fullest KV pool."""
    retracted = [s.retracted_total for s in samples]
    return LoadSample(
        running=sum(s.running for s in samples),
        queued=sum(s.queued for s in samples),
        token_usage=max((s.token_usage for s in samples), default=0.0),
        gen_throughput=sum(s.gen_throughput for s in samples),
        retracted_total=None if None in retracted else sum(r or 0 for r in retracted),
    )


class LoadReader:
    """Reads the load of one or more servers; ``await read()`` -> :class:`LoadSample`."""

    def __init__(self, urls: list[str], api_key: str | None = None, timeout_s: float = 5.0):
        self.urls = [u.rstrip("/") for u in urls]
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.timeout = aiohttp.ClientTimeout(total=timeout_s)
        self.has_metrics: dict[str, bool] = {}
        self._session: aiohttp.ClientSession | None = None

    async def _one(self, session: aiohttp.ClientSession, url: str) -> LoadSample:
        if self.has_metrics.get(url, True):
            async with session.get(f"{url}/metrics", headers=self.headers) as r:
                if r.status == 200:
                    self.has_metrics[url] = True
                    return parse_metrics(await r.text())
                if r.status != 404:
                    r.raise_for_status()
            self.has_metrics[url] = False  # launched without --enable-metrics
        async with session.get(f"{url}/v1/loads", headers=self.headers) as r:
            r.raise_for_status()
            return parse_loads(await r.read())

    async def read(self) -> LoadSample:
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=self.timeout)
        samples = await asyncio.gather(*(self._one(self._session, u) for u in self.urls))
        return combine(list(samples))

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
