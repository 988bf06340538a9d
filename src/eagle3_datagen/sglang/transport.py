"""An httpx transport for many small JSON round trips: HTTP/1.1 keep-alive over asyncio protocols.

Why our own: a GPU node costs far more than the client, and the client must never be what
limits it. Client CPU per /generate call, 150 in flight, ~200 output tokens, on the 2-core
client machines (``benchmarks/transports.py``): httpx's own transport 3.2-4.7 ms, httpx over
``httpx-aiohttp`` ~1.0 ms, bare aiohttp 0.4-0.5 ms, ``httpx.AsyncClient`` over this transport
~0.5 ms, and ``SGLangClient``'s prepared path over it ~0.23 ms. /generate is a plain
request/response exchange (no streaming, no redirects, no cookies), so the whole body is read
at once and handed over finished; httpx stays the API the code talks to
(``httpx.AsyncClient(transport=...)``; tests can swap in ``httpx.MockTransport``).

What it speaks: HTTP/1.1 (and 1.0 answers) over TCP or TLS; request bodies of known length;
responses framed by Content-Length, chunked transfer coding, or connection close. Keep-alive
connections are reused LIFO and expire after ``keepalive_expiry`` idle seconds. Timeouts follow
httpx: ``connect``, ``pool`` (waiting for a connection slot) and ``read`` (no byte for that
long). Failures raise httpx's exceptions (``ConnectError``, ``ReadError``, ``ReadTimeout``,
``RemoteProtocolError``, ...), so callers map them like any httpx error.
"""

from __future__ import annotations

import asyncio
import ssl
from collections import deque
from typing import Any

import httpx

_MAX_HEAD = 1 << 16  # a response head larger than this is not an SGLang answer
_NO_BODY = frozenset({204, 304})


class _Response:
    """A response read in full: status, raw headers, body, and whether the socket is reusable."""

    __slots__ = ("body", "headers", "keep_alive", "reason", "status", "version")

    def __init__(
        self,
        status: int,
        reason: bytes,
        version: bytes,
        headers: list[tuple[bytes, bytes]],
        body: bytes,
        keep_alive: bool,
    ) -> None:
        self.status = status
        self.reason = reason
        self.version = version
        self.headers = headers
        self.body = body
        self.keep_alive = keep_alive


class _Connection(asyncio.Protocol):
    """One socket; one request at a time. Parses the response as bytes arrive."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.idle_since = 0.0
        self._buf = bytearray()
        self._waiter: asyncio.Future[_Response] | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._read_timeout: float | None = None
        self._last_data = 0.0
        self._got_bytes = False
        self._head_only = False
        self._reset_parser()

    def _reset_parser(self) -> None:
        self._head: tuple[int, bytes, bytes, list[tuple[bytes, bytes]], bool] | None = None
        self._length = -1  # Content-Length, or -1
        self._chunked = False
        self._until_close = False
        self._chunks: list[bytes] = []

    # ----- asyncio.Protocol -----

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self._got_bytes = True
        if self._waiter is None:
            # Bytes nobody asked for (a server talking out of turn): the socket is unusable.
            self.close()
            return
        self._buf += data
        if self._read_timeout is not None:
            self._last_data = asyncio.get_running_loop().time()
        try:
            response = self._parse()
        except httpx.RemoteProtocolError as err:
            self._fail(err)
            self.close()
            return
        if response is not None:
            waiter, self._waiter = self._waiter, None
            self._cancel_timer()
            if not waiter.done():
                waiter.set_result(response)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self._waiter is None:
            return
        if self._until_close and self._head is not None and exc is None:
            status, reason, version, headers, _ = self._head
            waiter, self._waiter = self._waiter, None
            self._cancel_timer()
            if not waiter.done():
                body = bytes(self._buf)
                waiter.set_result(_Response(status, reason, version, headers, body, False))
            return
        if isinstance(exc, OSError):
            self._fail(httpx.ReadError(f"connection lost: {exc!r}"))
        elif self._got_bytes:
            self._fail(httpx.RemoteProtocolError("server disconnected in the middle of a response"))
        else:
            self._fail(httpx.RemoteProtocolError("server disconnected without sending a response"))

    # ----- one exchange -----

    async def exchange(
        self, data: list[bytes], read_timeout: float | None, head_only: bool = False
    ) -> _Response:
        """Send a request and wait for its complete response (``head_only``: a HEAD request)."""
        assert self.transport is not None
        loop = asyncio.get_running_loop()
        self._waiter = waiter = loop.create_future()
        self._got_bytes = False
        self._head_only = head_only
        self._reset_parser()
        self._buf.clear()
        self._read_timeout = read_timeout
        if read_timeout is not None:
            self._last_data = loop.time()
            self._timer = loop.call_later(read_timeout, self._check_timeout)
        self.transport.writelines(data)
        try:
            return await waiter
        finally:
            self._waiter = None
            self._cancel_timer()

    def _check_timeout(self) -> None:
        self._timer = None
        if self._waiter is None or self._read_timeout is None:
            return
        loop = asyncio.get_running_loop()
        quiet = loop.time() - self._last_data
        if quiet >= self._read_timeout:
            self._fail(httpx.ReadTimeout(f"no data for {self._read_timeout:g} s"))
            self.close()
        else:
            self._timer = loop.call_later(self._read_timeout - quiet, self._check_timeout)

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _fail(self, err: Exception) -> None:
        waiter, self._waiter = self._waiter, None
        self._cancel_timer()
        if waiter is not None and not waiter.done():
            waiter.set_exception(err)

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()

    def abort(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.abort()

    # ----- parsing -----

    def _parse(self) -> _Response | None:
        """A complete response from the buffer, or None if more bytes are needed."""
        buf = self._buf
        while self._head is None:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                if len(buf) > _MAX_HEAD:
                    raise httpx.RemoteProtocolError("response head too large")
                return None
            head = bytes(buf[:end])
            del buf[: end + 4]
            parsed = self._parse_head(head)
            if parsed is not None:  # None: an interim 1xx answer, read on
                self._head = parsed
        status, reason, version, headers, keep_alive = self._head
        if self._until_close:
            return None
        if self._chunked:
            if not self._parse_chunks():
                return None
            body = b"".join(self._chunks)
        else:
            if len(buf) < self._length:
                return None
            body = bytes(buf[: self._length])
            del buf[: self._length]
        if buf:
            keep_alive = False  # trailing garbage: do not trust this socket again
        return _Response(status, reason, version, headers, body, keep_alive)

    def _parse_head(
        self, head: bytes
    ) -> tuple[int, bytes, bytes, list[tuple[bytes, bytes]], bool] | None:
        lines = head.split(b"\r\n")
        parts = lines[0].split(b" ", 2)
        if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or len(parts[1]) != 3:
            raise httpx.RemoteProtocolError(f"not an HTTP/1.x status line: {lines[0][:80]!r}")
        try:
            status = int(parts[1])
        except ValueError:
            raise httpx.RemoteProtocolError(f"bad status code {parts[1]!r}") from None
        if 100 <= status < 200 and status != 101:
            return None
        version = parts[0][5:]
        reason = parts[2] if len(parts) > 2 else b""
        headers: list[tuple[bytes, bytes]] = []
        length: int | None = None
        chunked = False
        connection = b""
        for line in lines[1:]:
            name, sep, value = line.partition(b":")
            if not sep or not name or name[-1:] in (b" ", b"\t"):
                raise httpx.RemoteProtocolError(f"malformed header line {line[:80]!r}")
            value = value.strip()
            headers.append((name, value))
            lname = name.lower()
            if lname == b"content-length":
                try:
                    n = int(value)
                except ValueError:
                    raise httpx.RemoteProtocolError(f"bad Content-Length {value!r}") from None
                if n < 0 or (length is not None and n != length):
                    raise httpx.RemoteProtocolError(f"bad Content-Length {value!r}")
                length = n
            elif lname == b"transfer-encoding":
                chunked = value.lower().endswith(b"chunked")
            elif lname == b"connection":
                connection = value.lower()
        keep_alive = b"close" not in connection and (
            version == b"1.1" or b"keep-alive" in connection
        )
        if status in _NO_BODY or self._head_only:
            self._length = 0
        elif chunked:
            self._chunked = True
        elif length is not None:
            self._length = length
        else:
            self._until_close = True
            keep_alive = False
        return status, reason, version, headers, keep_alive

    def _parse_chunks(self) -> bool:
        """Consume chunked-coded body bytes; True once the last chunk and trailers are in."""
        buf = self._buf
        while True:
            if self._length == -1:  # expecting a chunk-size line
                nl = buf.find(b"\r\n")
                if nl < 0:
                    return False
                size_text = bytes(buf[:nl]).split(b";", 1)[0].strip()
                try:
                    size = int(size_text, 16)
                except ValueError:
                    raise httpx.RemoteProtocolError(f"bad chunk size {size_text[:20]!r}") from None
                del buf[: nl + 2]
                if size == 0:
                    self._length = -2  # trailers follow
                else:
                    self._length = size
            if self._length == -2:
                end = buf.find(b"\r\n")
                if end < 0:
                    return False
                del buf[: end + 2]
                if end == 0:  # the empty line after the (usually absent) trailers
                    self._length = -1
                    return True
                continue
            if len(buf) < self._length + 2:
                return False
            self._chunks.append(bytes(buf[: self._length]))
            del buf[: self._length + 2]
            self._length = -1


class Prepared:
    """A request's fixed part (origin, request line, headers), built once and sent many times."""

    __slots__ = ("head", "head_only", "key", "needs_length")

    def __init__(self, key: tuple[str, str, int], head: bytes, method: str) -> None:
        self.key = key
        self.head = head  # ends just before the Content-Length line
        self.head_only = method == "HEAD"  # the answer has no body, whatever its headers say
        # RFC 9110: no Content-Length on a bodiless request whose method expects no body.
        self.needs_length = method in ("POST", "PUT", "PATCH")


class HTTP11Transport(httpx.AsyncBaseTransport):
    """A pool of keep-alive HTTP/1.1 connections to any number of origins.

    ``prepare`` + ``send_prepared`` is the hot path for one request shape sent many times with
    different bodies (``/generate``): no ``httpx.Request``/``Response`` objects per call, which
    halves the client's CPU per request. ``handle_async_request`` serves everything else.
    """

    def __init__(
        self,
        *,
        max_connections: int = 256,
        keepalive_expiry: float = 4.0,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self.max_connections = max_connections
        self.keepalive_expiry = keepalive_expiry
        self._ssl_context = ssl_context
        self._idle: dict[tuple[str, str, int], deque[_Connection]] = {}
        self._slots: asyncio.Semaphore | None = None
        self._closed = False

    def prepare(self, method: str, url: httpx.URL, headers: httpx.Headers) -> Prepared:
        """The fixed part of ``method url`` with ``headers`` (Host is added when missing)."""
        if url.scheme not in ("http", "https"):
            raise httpx.UnsupportedProtocol(f"unsupported URL scheme {url.scheme!r}")
        key = (url.scheme, url.host, url.port or (443 if url.scheme == "https" else 80))
        lines = [method.encode("ascii"), b" ", url.raw_path or b"/", b" HTTP/1.1\r\n"]
        if "host" not in headers:
            lines += [b"Host: ", url.netloc, b"\r\n"]
        for name, value in headers.raw:
            if name.lower() not in (b"transfer-encoding", b"content-length"):
                lines += [name, b": ", value, b"\r\n"]  # the body's length is always known
        return Prepared(key, b"".join(lines), method.upper())

    async def send_prepared(
        self, prepared: Prepared, body: bytes, timeouts: dict[str, Any]
    ) -> tuple[int, bytes]:
        """Send ``body`` with a prepared head; return the status and the whole response body."""
        response = await self._roundtrip(prepared, body, timeouts)
        return response.status, response.body

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        try:
            body = request.content
        except httpx.RequestNotRead:
            body = await request.aread()
        prepared = self.prepare(request.method, request.url, request.headers)
        timeouts: dict[str, Any] = request.extensions.get("timeout") or {}
        response = await self._roundtrip(prepared, body, timeouts)
        return httpx.Response(
            response.status,
            headers=response.headers,
            content=response.body,
            request=request,
            extensions={
                "http_version": b"HTTP/" + response.version,
                "reason_phrase": response.reason,
            },
        )

    async def _roundtrip(
        self, prepared: Prepared, body: bytes, timeouts: dict[str, Any]
    ) -> _Response:
        key = prepared.key
        if self._closed:
            raise httpx.ConnectError("the transport is closed")
        if self._slots is None:
            self._slots = asyncio.Semaphore(self.max_connections)
        slots = self._slots
        if slots.locked():
            try:
                async with asyncio.timeout(timeouts.get("pool")):
                    await slots.acquire()
            except TimeoutError:
                raise httpx.PoolTimeout("no free connection within the pool timeout") from None
        else:
            await slots.acquire()  # returns at once
        try:
            conn = self._take_idle(key)
            if conn is None:
                conn = await self._connect(key, timeouts.get("connect"))
            if body or prepared.needs_length:
                length = b"Content-Length: %d\r\n\r\n" % len(body)
            else:
                length = b"\r\n"
            try:
                response = await conn.exchange(
                    [prepared.head, length, body], timeouts.get("read"), prepared.head_only
                )
            except asyncio.CancelledError:
                conn.abort()  # the answer may still come: never reuse this socket
                raise
            except httpx.TransportError:
                conn.close()
                raise
            if response.keep_alive and not conn.closed and not self._closed:
                conn.idle_since = asyncio.get_running_loop().time()
                self._idle.setdefault(key, deque()).append(conn)
            else:
                conn.close()
            return response
        finally:
            slots.release()

    def _take_idle(self, key: tuple[str, str, int]) -> _Connection | None:
        idle = self._idle.get(key)
        if not idle:
            return None
        now = asyncio.get_running_loop().time()
        while idle:
            conn = idle.pop()  # most recent first: the least likely to be closed by the server
            if not conn.closed and now - conn.idle_since < self.keepalive_expiry:
                assert conn.transport is not None
                if not conn.transport.is_closing():
                    return conn
            conn.close()
        return None

    async def _connect(self, key: tuple[str, str, int], connect_s: float | None) -> _Connection:
        scheme, host, port = key
        loop = asyncio.get_running_loop()
        tls = self._ssl() if scheme == "https" else None
        try:
            async with asyncio.timeout(connect_s):
                _, conn = await loop.create_connection(
                    _Connection, host, port, ssl=tls, server_hostname=host if tls else None
                )
        except TimeoutError:
            raise httpx.ConnectTimeout(f"connect to {host}:{port} timed out") from None
        except (OSError, ssl.SSLError) as err:
            raise httpx.ConnectError(f"cannot connect to {host}:{port}: {err}") from None
        return conn

    def _ssl(self) -> ssl.SSLContext:
        if self._ssl_context is None:
            self._ssl_context = ssl.create_default_context()
        return self._ssl_context

    async def aclose(self) -> None:
        self._closed = True
        for idle in self._idle.values():
            while idle:
                idle.pop().close()
        self._idle.clear()
