"""Read a server's load: SGLang's Prometheus ``/metrics``, or ``/v1/loads`` without it.

``/metrics`` exists only when SGLang runs with ``--enable-metrics`` (the run adds the flag when
it launches the server for a tier with ``concurrency: auto``); it has everything the
concurrency controller needs, retractions included (``sglang:num_retracted_requests_total``).
``/v1/loads`` is always served by SGLang 0.5.23 but has no retraction count. Several servers
(comma-separated URLs) are read one by one and summed.

What a URL serves is found out once, at the start (:meth:`LoadReader.detect`): a ``/metrics``
that answers 200 without SGLang's series (a router's, e.g. sglang-router's ``sgl_router_*``, or
a proxy's own) is not SGLang's and is not read again; then ``/v1/loads``, if it is SGLang's;
else nothing, and :meth:`LoadReader.read` returns None: the controller steers on what the
responses themselves report (retractions in ``meta_info``) and says so once.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import aiohttp
import orjson
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

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
    token usage is their maximum. Only the lines of the series read here go through the
    parser: SGLang's whole exposition (~420 lines, mostly histogram buckets) cost ~12 ms of
    client CPU a reading that way, against ~0.2 ms, and ``concurrency: auto`` reads it every
    few seconds per server (figure (e)'s controller every 0.02 s)."""
    families = _families("\n".join(line for line in text.splitlines() if _series(line) in _NAMES))
    sums: dict[str, float] = {}
    usage = 0.0
    for family in families:
        for sample in family.samples:
            key = _NAMES.get(sample.name)
            if key is None:
                continue
            if key == "token_usage":
                usage = max(usage, sample.value)
            else:
                sums[key] = sums.get(key, 0.0) + sample.value
    if "running" not in sums:
        raise NotSGLangMetrics(_kind(_families(text)))
    return LoadSample(
        running=int(sums.get("running", 0)),
        queued=int(sums.get("queued", 0)),
        token_usage=usage,
        gen_throughput=sums.get("gen_throughput", 0.0),
        # SGLang's counter has no series until its first retraction (prometheus_client's
        # labelled counters appear once used): absent from SGLang's exposition means none yet.
        retracted_total=int(sums.get("retracted_total", 0)),
    )


class NotSGLangMetrics(ValueError):
    """A ``/metrics`` body without SGLang's series; the message says whose it looks like."""


def _series(line: str) -> str:
    """The series name a sample line starts with ("" for a comment)."""
    return line.partition("{")[0].partition(" ")[0]


def _families(text: str) -> list[Metric]:
    """The exposition's families, read by prometheus_client's own parser (SGLang's exposition
    is written by prometheus_client); a body that is not Prometheus text (a proxy's HTML page)
    is :class:`NotSGLangMetrics`."""
    try:
        return list(text_string_to_metric_families(text))
    except ValueError as err:
        raise NotSGLangMetrics(f"not Prometheus text ({str(err)[:100]})") from err


def metrics_kind(text: str) -> str:
    """Whose exposition ``text`` looks like, for the one warning: SGLang's, sglang-router's, or
    another's (named by its first few metric names)."""
    try:
        return _kind(_families(text))
    except NotSGLangMetrics as err:
        return str(err)


def _kind(families: list[Metric]) -> str:
    """SGLang's, a router's, or another's, by the names of the families and their samples."""
    names = [f.name for f in families] + [s.name for f in families for s in f.samples]
    if "sglang:num_running_reqs" in names:
        return "SGLang's"
    if any(n.startswith("sgl_router_") for n in names):
        return "a router's (sglang-router: sgl_router_*)"
    shown = ", ".join(list(dict.fromkeys(f.name for f in families))[:3])
    return f"not SGLang's (first names: {shown or 'none'})"


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


# Where a URL's load comes from, once detected.
METRICS, LOADS, RESPONSES = "/metrics", "/v1/loads", "responses"


class LoadReader:
    """Reads the load of one or more servers; ``await read()`` -> :class:`LoadSample`, or None
    where some server's load cannot be read (the responses are all there is)."""

    def __init__(self, urls: list[str], api_key: str | None = None, timeout_s: float = 5.0):
        self.urls = [u.rstrip("/") for u in urls]
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.timeout = aiohttp.ClientTimeout(total=timeout_s)
        self.source: dict[str, str] = {}  # url -> METRICS, LOADS or RESPONSES, once detected
        self.notes: list[str] = []  # what detection found, for the caller's one warning
        self._session: aiohttp.ClientSession | None = None

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=self.timeout)
        return self._session

    async def detect(self) -> None:
        """Find, per URL, where its load can be read; a URL whose ``/metrics`` cannot serve
        leaves a line in :attr:`notes`."""
        await asyncio.gather(*(self._detect(u) for u in self.urls))

    def take_notes(self) -> list[str]:
        notes, self.notes = self.notes, []
        return notes

    async def _detect(self, url: str) -> None:
        note = await self._find_source(url)
        if note:
            self.notes.append(note)

    async def _find_source(self, url: str) -> str:
        why = ""
        try:
            async with self.session.get(f"{url}/metrics", headers=self.headers) as r:
                body = await r.text() if r.status == 200 else ""
                status = r.status
        except (aiohttp.ClientError, TimeoutError) as err:
            status, body = 0, ""
            why = f"unreadable ({err!r})"
        if status == 200:
            try:
                parse_metrics(body)
                self.source[url] = METRICS
                return ""
            except NotSGLangMetrics as err:
                why = f"answers 200 but is {err}"
        elif status:
            why = f"answers HTTP {status}" + (" (no --enable-metrics)" if status == 404 else "")
        try:
            async with self.session.get(f"{url}/v1/loads", headers=self.headers) as r:
                r.raise_for_status()
                parse_loads(await r.read())
            self.source[url] = LOADS
            return f"{url}/metrics {why}: reading {url}/v1/loads (no retraction count)"
        except Exception:  # a router's 404, a proxy's HTML, a connection error: not usable
            self.source[url] = RESPONSES
            return (
                f"{url}/metrics {why}, and {url}/v1/loads is not SGLang's: steering on the "
                "responses alone (retractions they report; no queue or KV readings)"
            )

    async def _one(self, url: str) -> LoadSample | None:
        source = self.source.get(url, METRICS)
        if source == METRICS:
            async with self.session.get(f"{url}/metrics", headers=self.headers) as r:
                r.raise_for_status()
                text = await r.text()
            try:
                return parse_metrics(text)
            except NotSGLangMetrics:  # another server behind the URL now: look again
                await self._detect(url)
                return await self._one(url)
        if source == LOADS:
            async with self.session.get(f"{url}/v1/loads", headers=self.headers) as r:
                r.raise_for_status()
                return parse_loads(await r.read())
        return None

    async def read(self) -> LoadSample | None:
        samples = await asyncio.gather(*(self._one(u) for u in self.urls))
        if any(s is None for s in samples):
            return None
        return combine([s for s in samples if s is not None])

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
