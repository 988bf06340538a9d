"""HTTP11Transport against a scripted server: framing, reuse, timeouts, errors, and the client.

Why scripted: the emulator only ever answers one way (Content-Length, keep-alive); SGLang sits
behind uvicorn, routers and proxies that may answer chunked, close the connection, or die.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import httpx
import orjson
import pytest

from eagle3_datagen.errors import RejectedRequestError, RetryableRequestError
from eagle3_datagen.sglang.client import SGLangClient
from eagle3_datagen.sglang.transport import HTTP11Transport

Reply = tuple[bytes, bool] | None  # (bytes to send, close after) or None: close, no answer
GENERATE_BODY = orjson.dumps(
    {"output_ids": [5, 6, 7], "meta_info": {"id": "r", "prompt_tokens": 3,
     "completion_tokens": 3, "finish_reason": {"type": "stop", "matched": 7}}}
)  # fmt: skip


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


def ok(body: bytes = b'{"ok": true}', extra: bytes = b"") -> Reply:
    return (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n%s\r\n%s"
            % (len(body), extra, body), False)  # fmt: skip


async def test_reuses_one_connection_and_sends_what_httpx_built() -> None:
    async with (
        serve(lambda h, b: ok()) as srv,
        httpx.AsyncClient(transport=HTTP11Transport()) as client,
    ):
        r1 = await client.post(f"{srv.url}/generate?x=1", content=b"abc",
                               headers={"Authorization": "Bearer k"})  # fmt: skip
        r2 = await client.get(f"{srv.url}/server_info")
    assert r1.json() == {"ok": True} and r2.status_code == 200
    assert srv.connections == 1, "keep-alive: the second request reuses the socket"
    head, body = srv.requests[0]
    assert head.startswith(b"POST /generate?x=1 HTTP/1.1\r\n")
    assert b"\r\nauthorization: bearer k\r\n" in head.lower()
    assert b"\r\nhost: 127.0.0.1:" in head.lower() and body == b"abc"
    assert srv.requests[1][0].startswith(b"GET /server_info HTTP/1.1\r\n")


async def test_chunked_body_with_extensions_and_trailers() -> None:
    chunked = (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
               b"5;ext=1\r\nhello\r\n6\r\n world\r\n0\r\nX-Trailer: t\r\n\r\n")  # fmt: skip
    async with (
        serve(lambda h, b: (chunked, False)) as srv,
        httpx.AsyncClient(transport=HTTP11Transport()) as client,
    ):
        r = await client.get(srv.url)
        again = await client.get(srv.url)
    assert r.content == b"hello world" and again.content == b"hello world"
    assert srv.connections == 1


async def test_close_delimited_body_and_interim_100_continue() -> None:
    reply = b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.0 200 OK\r\n\r\nuntil the end"
    async with (
        serve(lambda h, b: (reply, True)) as srv,
        httpx.AsyncClient(transport=HTTP11Transport()) as client,
    ):
        r = await client.get(srv.url)
        await client.get(srv.url)
    assert r.content == b"until the end" and r.http_version == "HTTP/1.0"
    assert srv.connections == 2, "a close-delimited answer leaves nothing to reuse"


async def test_connection_close_header_is_honoured() -> None:
    async with (
        serve(lambda h, b: ok(extra=b"Connection: close\r\n")) as srv,
        httpx.AsyncClient(transport=HTTP11Transport()) as client,
    ):
        await client.get(srv.url)
        await client.get(srv.url)
    assert srv.connections == 2


async def test_idle_connections_expire() -> None:
    async with (
        serve(lambda h, b: ok()) as srv,
        httpx.AsyncClient(transport=HTTP11Transport(keepalive_expiry=0.05)) as client,
    ):
        await client.get(srv.url)
        await asyncio.sleep(0.15)
        await client.get(srv.url)
    assert srv.connections == 2


@pytest.mark.parametrize(
    ("reply", "error"),
    [
        (None, httpx.RemoteProtocolError),  # closed without an answer
        ((b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort", True), httpx.RemoteProtocolError),
        ((b"SSH-2.0-OpenSSH\r\n\r\n", False), httpx.RemoteProtocolError),
        ((b"HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n", False), httpx.RemoteProtocolError),
        ((b"HANG", False), httpx.ReadTimeout),
    ],
)
async def test_failures_raise_httpx_errors(reply: Reply, error: type[Exception]) -> None:
    async with (
        serve(lambda h, b: reply) as srv,
        httpx.AsyncClient(transport=HTTP11Transport(), timeout=0.3) as client,
    ):
        with pytest.raises(error):
            await client.get(srv.url)
        # The broken socket is not reused: a later good exchange still works.
        srv.respond = lambda h, b: ok()
        assert (await client.get(srv.url)).status_code == 200


async def test_connect_errors() -> None:
    async with serve(lambda h, b: ok()) as srv:
        url = srv.url
    async with httpx.AsyncClient(transport=HTTP11Transport()) as client:
        with pytest.raises(httpx.ConnectError):
            await client.get(url)  # nothing listens there any more


async def test_pool_limit_queues_and_times_out() -> None:
    async with serve(lambda h, b: (b"HANG", False) if b"/hang" in h else ok()) as srv:
        transport = HTTP11Transport(max_connections=1)
        async with httpx.AsyncClient(transport=transport) as client:
            hung = asyncio.create_task(client.get(f"{srv.url}/hang", timeout=30))
            await asyncio.sleep(0.1)
            with pytest.raises(httpx.PoolTimeout):
                await client.get(srv.url, timeout=httpx.Timeout(30, pool=0.2))
            hung.cancel()
            with pytest.raises(asyncio.CancelledError):
                await hung
            # The cancelled exchange's socket is dropped, its slot freed.
            assert (await client.get(srv.url)).status_code == 200
    assert srv.connections == 2


async def test_client_generate_hot_path_and_error_mapping() -> None:
    statuses = iter([200, 400, 503])

    def respond(head: bytes, body: bytes) -> Reply:
        status = next(statuses)
        if status == 200:
            return ok(GENERATE_BODY)
        text = b'{"error": {"message": "nope"}}'
        return (b"HTTP/1.1 %d X\r\nContent-Length: %d\r\n\r\n%s" % (status, len(text), text),
                False)  # fmt: skip

    async with serve(respond) as srv, SGLangClient(srv.url, api_key="k") as client:
        result = await client.generate([1, 2, 3], {"max_new_tokens": 3}, "rid-1")
        with pytest.raises(RejectedRequestError, match="HTTP 400: nope"):
            await client.generate([1], {}, "rid-2")
        with pytest.raises(RetryableRequestError, match="HTTP 503"):
            await client.generate([1], {}, "rid-3")
    assert result.output_ids == [5, 6, 7] and result.finish_matched == 7
    head, body = srv.requests[0]
    assert b"\r\nAuthorization: Bearer k\r\n" in head
    assert orjson.loads(body) == {"input_ids": [1, 2, 3], "sampling_params":
                                  {"max_new_tokens": 3}, "rid": "rid-1"}  # fmt: skip


async def test_client_maps_transport_failures_to_retryable() -> None:
    async with serve(lambda h, b: None) as srv, SGLangClient(srv.url) as client:
        with pytest.raises(RetryableRequestError, match="connection error"):
            await client.generate([1], {}, "r")
    async with (
        serve(lambda h, b: (b"HANG", False)) as srv,
        SGLangClient(srv.url, timeout_s=0.2) as client,
    ):
        with pytest.raises(RetryableRequestError, match="timeout"):
            await client.generate([1], {}, "r")


async def test_client_accepts_any_httpx_transport() -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, content=GENERATE_BODY)

    async with SGLangClient("http://sglang:8000", transport=httpx.MockTransport(handler)) as c:
        result = await c.generate([1, 2, 3], {}, "rid")
    assert result.output_ids == [5, 6, 7]
    assert str(seen[0].url) == "http://sglang:8000/generate"
    assert orjson.loads(seen[0].content)["rid"] == "rid"


async def test_head_answer_has_no_body_and_get_sends_no_length() -> None:
    async with (
        serve(lambda h, b: ok(b"x" * 10) if h.startswith(b"GET") else (
            b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n", False)) as srv,
        httpx.AsyncClient(transport=HTTP11Transport()) as client,
    ):  # fmt: skip
        head = await client.head(srv.url)
        got = await client.get(srv.url)
    assert head.content == b"" and got.content == b"x" * 10
    assert srv.connections == 1, "the HEAD answer's socket is reusable"
    assert all(b"content-length" not in h.lower() for h, _ in srv.requests)
