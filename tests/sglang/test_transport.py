"""SGLangClient's HTTP behaviour: what it sends, how answers and failures map to our errors,
keep-alive reuse, and the stale keep-alive race against a real uvicorn server.

Two kinds of server: a scripted asyncio server for answers the emulator never gives (a close
without an answer, a cut body, a hang), and uvicorn (SGLang's HTTP server) as a separate process
for the keep-alive race.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import orjson
import pytest

from eagle3_datagen.config import RetryPolicy
from eagle3_datagen.errors import (
    AuthenticationError,
    RejectedRequestError,
    RetryableRequestError,
)
from eagle3_datagen.sglang.client import GenerateRequest, SGLangClient, request_id
from eagle3_datagen.sglang.requests import generate_with_retries
from tests.support import free_port, wait_until
from tests.support.emulator import EmulatorProcess

Reply = tuple[bytes, bool] | None  # (bytes to send, close after) or None: close, no answer
GENERATE_BODY = orjson.dumps(
    {
        "output_ids": [5, 6, 7],
        "meta_info": {
            "id": "r",
            "prompt_tokens": 3,
            "completion_tokens": 3,
            "finish_reason": {"type": "stop", "matched": 7},
        },
    }
)
HERE = Path(__file__).resolve().parent


class Server:
    """A local HTTP/1.1 server; ``respond(head, body)`` decides each answer."""

    def __init__(self, respond: Callable[[bytes, bytes], Reply]) -> None:
        self.respond = respond
        self.connections = 0
        self.requests: list[tuple[bytes, bytes]] = []
        self.url = ""

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    name, _, value = line.partition(b":")
                    if name.lower() == b"content-length":
                        length = int(value)
                body = await reader.readexactly(length)
                self.requests.append((head, body))
                reply = self.respond(head, body)
                if reply is None:
                    return
                data, close = reply
                if data == b"HANG":
                    await asyncio.sleep(3600)
                writer.write(data)
                await writer.drain()
                if close:
                    return
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            pass  # client gone, or the test's server shutting down
        finally:
            writer.close()


@asynccontextmanager
async def serve(respond: Callable[[bytes, bytes], Reply]) -> AsyncIterator[Server]:
    server = Server(respond)
    srv = await asyncio.start_server(server.handle, "127.0.0.1", 0)
    port = srv.sockets[0].getsockname()[1]
    server.url = f"http://127.0.0.1:{port}"
    try:
        yield server
    finally:
        srv.close()


def ok(body: bytes = GENERATE_BODY) -> Reply:
    return (
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
        % (len(body), body),
        False,
    )


def error(status: int, body: bytes) -> Reply:
    return (b"HTTP/1.1 %d X\r\nContent-Length: %d\r\n\r\n%s" % (status, len(body), body), False)


async def test_generate_sends_ids_sampling_rid_and_key_on_one_connection() -> None:
    async with serve(lambda h, b: ok()) as srv, SGLangClient(srv.url, api_key="k") as client:
        result = await client.generate(GenerateRequest([1, 2, 3], {"max_new_tokens": 3}, "rid-1"))
        await client.generate(GenerateRequest([4], {}, "rid-2"))
        info = await client.get_json("/server_info")
    assert result.output_ids == [5, 6, 7] and result.finish_matched == 7
    assert info["output_ids"] == [5, 6, 7]
    assert srv.connections == 1, "keep-alive: later requests reuse the socket"
    head, body = srv.requests[0]
    assert head.startswith(b"POST /generate HTTP/1.1\r\n")
    assert b"\r\nauthorization: bearer k\r\n" in head.lower()
    assert orjson.loads(body) == {
        "input_ids": [1, 2, 3],
        "sampling_params": {"max_new_tokens": 3},
        "rid": "rid-1",
    }
    assert srv.requests[2][0].startswith(b"GET /server_info HTTP/1.1\r\n")


@pytest.mark.parametrize(
    ("status", "body", "expected", "message"),
    [
        (
            400,
            b'{"error": {"message": "top_p must be in (0, 1], got 0.0."}}',
            RejectedRequestError,
            "HTTP 400: top_p must be in",
        ),
        (400, b'{"error": "unknown field `foo`"}', RejectedRequestError, "unknown field"),
        # SGLang still holds that rid (the earlier request is being aborted): retry, never
        # store the prompt as rejected.
        (
            400,
            b'{"error": {"message": "Duplicate request ID detected: p:1:0"}}',
            RetryableRequestError,
            "HTTP 400: Duplicate request ID",
        ),
        (
            503,
            b'{"object": "error", "message": "The request queue is full.", "code": 503}',
            RetryableRequestError,
            "HTTP 503: The request queue is full.",
        ),
        (500, b"Internal Server Error", RetryableRequestError, "HTTP 500"),
        (401, b'{"error": "Unauthorized"}', AuthenticationError, "refused the API key"),
        (403, b'{"error": "Forbidden"}', AuthenticationError, "HTTP 403: the server refused"),
    ],
)
async def test_status_maps_to_reject_or_retry(
    status: int, body: bytes, expected: type[Exception], message: str
) -> None:
    async with serve(lambda h, b: error(status, body)) as srv, SGLangClient(srv.url) as client:
        with pytest.raises(expected, match=message.replace("(", r"\(")) as info:
            await client.generate(GenerateRequest([1], {}, "p:1:0"))
    assert getattr(info.value, "status", None) == status


@pytest.mark.parametrize(
    ("reply", "message"),
    [
        (None, "connection error"),  # closed without an answer, on a fresh connection
        ((b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort", True), "connection error"),
        ((b"SSH-2.0-OpenSSH\r\n\r\n", False), "connection error"),
        ((b"HANG", False), "timeout"),
    ],
)
async def test_transport_failures_are_retryable_without_status(reply: Reply, message: str) -> None:
    async with (
        serve(lambda h, b: reply) as srv,
        SGLangClient(srv.url, timeout_s=0.5) as client,
    ):
        with pytest.raises(RetryableRequestError, match=message) as info:
            await client.generate(GenerateRequest([1], {}, "r"))
        assert info.value.status is None  # counts toward "server lost"
        assert len(srv.requests) == 1, "a fresh connection's failure is not resent"
        srv.respond = lambda h, b: ok()
        assert (await client.generate(GenerateRequest([1], {}, "r2"))).output_ids == [5, 6, 7]


async def test_nothing_listening() -> None:
    async with serve(lambda h, b: ok()) as srv:
        url = srv.url
    async with SGLangClient(url) as client:
        with pytest.raises(RetryableRequestError, match="connection error") as info:
            await client.generate(GenerateRequest([1], {}, "r"))
        assert info.value.status is None
        assert await client.health_status("/health") == 0


def test_request_ids_differ_per_run_and_attempt() -> None:
    ids = {request_id(run, "B1", 17, attempt) for run in ("a1b2", "c3d4") for attempt in (0, 1)}
    assert len(ids) == 4 and all(":B1:17:" in rid for rid in ids)


# --------------------------------------------------------------------------- real uvicorn


@dataclass
class Uvicorn:
    url: str
    proc: subprocess.Popen[bytes]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)


@pytest.fixture
def uvicorn() -> Iterator[Uvicorn]:
    """The stand-in app under uvicorn, closing idle keep-alive connections after 1 s."""
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "uvicorn",
            "keepalive_app:app",
            "--app-dir",
            str(HERE),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--timeout-keep-alive",
            "1",
            "--log-level",
            "warning",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    server = Uvicorn(f"http://127.0.0.1:{port}", proc)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                httpx.get(f"{server.url}/ping", timeout=1.0)
                break
            except httpx.TransportError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("uvicorn did not start") from None
                time.sleep(0.1)
        yield server
    finally:
        server.stop()


def _port(rid: str) -> str:
    return rid.rsplit("@", 1)[1]


async def test_a_request_on_a_connection_the_server_closed_is_resent_on_a_fresh_one(
    uvicorn: Uvicorn,
) -> None:
    async with SGLangClient(uvicorn.url) as client:
        first = await client.generate(GenerateRequest([1], {}, "a"))
        # The event loop is blocked (as by a prompt render or a Parquet write) past the
        # server's keep-alive: uvicorn closes the idle connection, and the client has not seen
        # it when it sends the next request on it.
        time.sleep(1.5)
        second = await client.generate(GenerateRequest([1], {}, "b"))
        third = await client.generate(GenerateRequest([1], {}, "c"))
    assert second.rid.startswith("b@"), "answered: no error reached the caller"
    assert _port(second.rid) != _port(first.rid), "answered on a fresh connection"
    assert _port(third.rid) != _port(first.rid)


async def test_a_server_gone_for_good_still_fails_after_the_one_resend(uvicorn: Uvicorn) -> None:
    async with SGLangClient(uvicorn.url) as client:
        await client.generate(GenerateRequest([1], {}, "a"))
        uvicorn.stop()  # blocks the loop: the client has not seen the close when it sends
        with pytest.raises(RetryableRequestError, match="connection error") as info:
            await client.generate(GenerateRequest([1], {}, "b"))
    assert info.value.status is None, "a connection error: counts toward 'server lost'"


async def test_a_rid_the_server_still_holds_is_retried_not_rejected(
    emulator_factory: Callable[..., EmulatorProcess],
) -> None:
    # SGLang 0.5.23 answers 400 "Duplicate request ID" while a request with that rid is in
    # flight (an earlier run's, or a cancelled batch's, still being aborted).
    emu = emulator_factory(
        "--emu-decode-ms-per-token",
        "10",
        "--emu-mean-output-tokens",
        "100",
        "--emu-output-sigma",
        "0",
    ).wait_ready()
    retried: list[int] = []
    async with SGLangClient(emu.url) as client:
        earlier = asyncio.create_task(client.generate(GenerateRequest([1, 2, 3], {}, "B1:17:0")))
        await asyncio.to_thread(wait_until, lambda: emu.stats()["running"] == 1)
        result = await generate_with_retries(
            client,
            [1, 2, 3],
            {"max_new_tokens": 4},
            # the first try reuses the held rid, as a rerun with partition:line:attempt did
            rid=lambda attempt: request_id("run2", "B1", 17, attempt) if attempt else "B1:17:0",
            policy=RetryPolicy(max_attempts=3, backoff_initial_s=0.0),
            on_retry=lambda: retried.append(1),
        )
        await earlier
    assert retried == [1], "one 400 for the held rid, then a try with another rid"
    assert result.rid == "run2:B1:17:1"
