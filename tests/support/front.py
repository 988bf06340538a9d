"""A round-robin HTTP front over several servers whose ``/metrics`` is its own, not SGLang's:
what a run attached to a router or a proxy sees (``python -m tests.support.front``).

It forwards ``POST /generate`` to its backends in turn and the info and health endpoints to the
first one that answers, serves ``/metrics`` in sglang-router's names (the ``sgl_router_*``
series its ``metrics.rs`` registers, with this front's own counts), and answers 404 at
``/v1/loads`` as sglang-router does. Used by the controller's tests and benchmark (e).

Connection lifetimes, as a router in front of SGLang must handle them: a client that goes away
cancels the forwarded request too (aiohttp >= 3.9 leaves a handler running after its client
left unless asked; before, the servers of benchmark (e) generated for every request of a
cancelled run, ``tests/sglang/test_front.py``); the listen backlog holds a burst of thousands
of new connections (auto's slow start opens ~1,000 at once; aiohttp's default of 128 was seen
82 deep during one); kept-alive connections to a backend expire before the backend's 5 s idle
close, and a request that meets one the backend closed anyway is sent once more on a new one,
as our client does (``sglang/client.py``), rather than answered 502.
"""

from __future__ import annotations

import argparse
import itertools
import subprocess
import sys
from pathlib import Path
from typing import Self

import aiohttp
from aiohttp import web

from tests.support import REPO, free_port, stop_process, wait_healthy

_FORWARDED_GETS = ("/health", "/health_generate", "/server_info", "/model_info", "/v1/models")
KEEPALIVE_S = 4.0  # below the backends' 5 s idle close (uvicorn's, and the emulator's)


class Front:
    def __init__(self, backends: list[str]) -> None:
        self.backends = [b.rstrip("/") for b in backends]
        self._next = itertools.cycle(range(len(self.backends)))
        self.requests: dict[str, int] = {}  # route -> requests (sgl_router_requests_total)
        self.processed = [0] * len(self.backends)
        self.running = [0] * len(self.backends)
        self._session: aiohttp.ClientSession | None = None

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=KEEPALIVE_S)
            self._session = aiohttp.ClientSession(
                connector=connector, timeout=aiohttp.ClientTimeout(total=None)
            )
        return self._session

    def _count(self, route: str) -> None:
        self.requests[route] = self.requests.get(route, 0) + 1

    async def generate(self, request: web.Request) -> web.StreamResponse:
        self._count("/generate")
        i = next(self._next)
        body = await request.read()
        headers = {k: v for k, v in request.headers.items() if k.lower() == "authorization"}
        self.running[i] += 1
        try:
            status, data = await self._post(f"{self.backends[i]}/generate", body, headers)
        except aiohttp.ClientError as err:
            return web.json_response({"error": f"backend unreachable: {err}"}, status=502)
        finally:
            self.running[i] -= 1
        self.processed[i] += 1
        return web.Response(body=data, status=status, content_type="application/json")

    async def _post(self, url: str, body: bytes, headers: dict[str, str]) -> tuple[int, bytes]:
        """POST to a backend; once more when a kept-alive connection turns out closed."""
        headers = {**headers, "Content-Type": "application/json"}
        for attempt in (1, 2):
            try:
                async with self.session.post(url, data=body, headers=headers) as r:
                    return r.status, await r.read()
            except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError) as err:
                if attempt == 2 or isinstance(err, aiohttp.ClientConnectorError):
                    raise
        raise AssertionError("unreachable")

    async def forward_get(self, request: web.Request) -> web.Response:
        self._count(request.path)
        headers = {k: v for k, v in request.headers.items() if k.lower() == "authorization"}
        for backend in self.backends:
            try:
                async with self.session.get(backend + request.path_qs, headers=headers) as r:
                    return web.Response(
                        body=await r.read(), status=r.status, content_type="application/json"
                    )
            except aiohttp.ClientError:
                continue
        return web.json_response({"error": "no backend answers"}, status=503)

    async def metrics(self, request: web.Request) -> web.Response:
        lines = [
            "# HELP sgl_router_requests_total Total number of requests by route and method",
            "# TYPE sgl_router_requests_total counter",
            *(f'sgl_router_requests_total{{route="{r}"}} {n}' for r, n in self.requests.items()),
            "# HELP sgl_router_active_workers Number of currently active workers",
            "# TYPE sgl_router_active_workers gauge",
            f"sgl_router_active_workers {len(self.backends)}",
            "# HELP sgl_router_processed_requests_total Total requests processed by each worker",
            "# TYPE sgl_router_processed_requests_total counter",
            *(
                f'sgl_router_processed_requests_total{{worker="{b}"}} {n}'
                for b, n in zip(self.backends, self.processed, strict=True)
            ),
            "# HELP sgl_router_running_requests Number of running requests per worker",
            "# TYPE sgl_router_running_requests gauge",
            *(
                f'sgl_router_running_requests{{worker="{b}"}} {n}'
                for b, n in zip(self.backends, self.running, strict=True)
            ),
        ]
        return web.Response(text="\n".join(lines) + "\n", content_type="text/plain")

    async def not_found(self, request: web.Request) -> web.Response:
        return web.Response(status=404, text="Not Found")

    def app(self) -> web.Application:
        app = web.Application(client_max_size=1 << 30)
        app.router.add_post("/generate", self.generate)
        for path in _FORWARDED_GETS:
            app.router.add_get(path, self.forward_get)
        app.router.add_get("/metrics", self.metrics)
        app.router.add_route("*", "/{tail:.*}", self.not_found)
        return app


class FrontProcess:
    """The front as a child process on a free port (output to ``log``); stopped by its pid."""

    def __init__(self, backends: list[str], log: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log
        cmd = [sys.executable, "-m", "tests.support.front", "--port", str(self.port)]
        for b in backends:
            cmd += ["--backend", b]
        with log.open("ab") as out:
            self.proc = subprocess.Popen(cmd, cwd=REPO, stdout=out, stderr=subprocess.STDOUT)

    def wait_ready(self, timeout_s: float = 30.0) -> Self:
        if not wait_healthy(
            self.proc,
            self.url,
            what="front",
            timeout_s=timeout_s,
            output=lambda: self.log.read_text()[-2000:],
        ):
            self.stop()
            raise TimeoutError(f"front at {self.url} not healthy after {timeout_s}s")
        return self

    def stop(self) -> int:
        return stop_process(self.proc)

    def __enter__(self) -> Self:
        return self.wait_ready()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--backend", action="append", required=True)
    args = ap.parse_args(argv)
    print(f"front on {args.port} over {args.backend}", file=sys.stderr, flush=True)
    web.run_app(
        Front(args.backend).app(),
        host="127.0.0.1",
        port=args.port,
        print=None,
        access_log=None,
        backlog=4096,
        handler_cancellation=True,  # a client that went away cancels its forwarded request
    )


if __name__ == "__main__":
    main()
