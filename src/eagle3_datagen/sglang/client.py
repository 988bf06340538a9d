"""Async client for SGLang's native HTTP API (``/generate``, ``/server_info``, health).

Why this transport: httpx is the API the code talks to (typed, mockable with
``httpx.MockTransport``), but what moves the bytes is :class:`HTTP11Transport`, because the
client's CPU per request decides whether a cheap client machine keeps a GPU node busy. Client
CPU per /generate call at 150 in flight on the 2-core client machines
(``benchmarks/transports.py``): httpx's native transport 3.2-4.7 ms, httpx over httpx-aiohttp
(this client before) ~1.0 ms, this client 0.23 ms. ``/generate``, the hot path, goes to the
transport as a prepared request (no ``httpx.Request``/``Response`` objects, no redirect, cookie
or auth hooks to run); the info and health endpoints go through a normal ``httpx.AsyncClient``.
Bodies are encoded and decoded with orjson (decoding a 200-token answer: 8 us, ``json`` 25 us).

HTTP status maps to our error types in exactly one place, :func:`raise_for_generate_status`.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import TracebackType
from typing import Any, Self

import httpx
import orjson

from eagle3_datagen.errors import RejectedRequestError, RetryableRequestError
from eagle3_datagen.sglang.transport import HTTP11Transport, Prepared

# uvicorn (SGLang's HTTP server) closes idle connections after 5 s; reusing one it is closing
# produces spurious "server disconnected" errors, so expire ours first.
KEEPALIVE_EXPIRY_S = 4.0
RETRYABLE_STATUS = frozenset({408, 429, 500, 502, 503, 504})


@dataclass(slots=True)
class GenerateResult:
    """One finished /generate item, with ``output_ids`` exactly as the server sent them."""

    rid: str
    output_ids: list[int]
    finish_type: str  # "stop" | "length" | "abort"
    finish_matched: int | str | None  # the matched stop token id (or string) for "stop"
    finish_message: str | None  # the abort message, if any
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    e2e_latency: float | None

    @classmethod
    def from_json(cls, item: dict[str, Any]) -> GenerateResult:
        """Parse one response item; a malformed body is a retryable server fault."""
        try:
            meta = item["meta_info"]
            output_ids = item["output_ids"]
            finish = meta.get("finish_reason") or {}
            return cls(
                rid=str(meta.get("id", "")),
                output_ids=output_ids,
                finish_type=str(finish.get("type", "abort")),
                finish_matched=finish.get("matched"),
                finish_message=finish.get("message"),
                prompt_tokens=int(meta["prompt_tokens"]),
                completion_tokens=int(meta.get("completion_tokens", len(output_ids))),
                cached_tokens=int(meta.get("cached_tokens", 0)),
                e2e_latency=meta.get("e2e_latency"),
            )
        except (KeyError, TypeError, ValueError, AttributeError) as err:
            raise RetryableRequestError(f"malformed /generate response: {err!r}") from None


def _error_message(body: bytes) -> str:
    """SGLang's error bodies come in three shapes; return the human message of any of them."""
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        return body.decode("utf-8", "replace").strip()[:500]
    if isinstance(data, dict):
        err = data.get("error")
        if isinstance(err, dict) and "message" in err:
            return str(err["message"])
        if isinstance(err, str):
            return err
        if "message" in data:
            return str(data["message"])
    return str(data)[:500]


def raise_for_generate_status(status: int, body: bytes) -> None:
    """Map an HTTP status to our error types: 4xx rejects the prompt, 429/5xx are retried."""
    if status == 200:
        return
    message = _error_message(body)
    if status in RETRYABLE_STATUS:
        raise RetryableRequestError(f"HTTP {status}: {message}", status=status)
    if status in (401, 403):
        # Not the prompt's fault: a wrong key fails every request, so fail loudly.
        raise RetryableRequestError(f"HTTP {status} (check the API key): {message}", status=status)
    raise RejectedRequestError(f"HTTP {status}: {message}", status=status)


class SGLangClient:
    """One connection pool to one SGLang server (or router). Use as an async context manager.

    Create it on the event loop that uses it: an httpx client cannot cross event loops.
    ``transport`` replaces the default :class:`HTTP11Transport` (e.g. ``httpx.MockTransport``
    in tests); ``/generate`` then goes through it as an ordinary ``httpx.Request``.
    """

    def __init__(
        self,
        base_url: str,
        *,
        api_key: str | None = None,
        timeout_s: float = 1800.0,
        max_connections: int = 256,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        headers = {"Content-Type": "application/json"}
        if api_key:
            headers["Authorization"] = f"Bearer {api_key}"
        self._transport = transport or HTTP11Transport(
            max_connections=max_connections, keepalive_expiry=KEEPALIVE_EXPIRY_S
        )
        timeout = httpx.Timeout(timeout_s, connect=30.0)
        self._http = httpx.AsyncClient(
            base_url=self.base_url, headers=headers, timeout=timeout, transport=self._transport
        )
        # The /generate request's fixed parts, built once.
        self._generate_url = httpx.URL(self.base_url + "/generate")
        self._post_headers = httpx.Headers(headers)
        self._timeouts = timeout.as_dict()
        self._prepared: Prepared | None = None
        if isinstance(self._transport, HTTP11Transport):
            self._prepared = self._transport.prepare("POST", self._generate_url, self._post_headers)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def _post_generate(self, body: bytes) -> tuple[int, bytes]:
        """POST /generate straight to the transport: no redirects, cookies or auth to run."""
        if self._prepared is not None:
            assert isinstance(self._transport, HTTP11Transport)
            try:
                return await self._transport.send_prepared(self._prepared, body, self._timeouts)
            except httpx.TimeoutException as err:
                raise RetryableRequestError(f"timeout on /generate: {err!r}") from None
            except httpx.TransportError as err:
                raise RetryableRequestError(f"connection error on /generate: {err!r}") from None
        request = httpx.Request(
            "POST",
            self._generate_url,
            headers=self._post_headers,
            content=body,
            extensions={"timeout": self._timeouts},
        )
        try:
            response = await self._transport.handle_async_request(request)
            try:
                content = await response.aread()
            finally:
                await response.aclose()
        except httpx.TimeoutException as err:
            raise RetryableRequestError(f"timeout on /generate: {err!r}") from None
        except httpx.TransportError as err:
            raise RetryableRequestError(f"connection error on /generate: {err!r}") from None
        return response.status_code, content

    async def generate(
        self, input_ids: list[int], sampling_params: dict[str, Any], rid: str
    ) -> GenerateResult:
        """Send one prompt as token ids; return the raw output ids and finish reason."""
        payload = {
            "input_ids": input_ids,
            "sampling_params": sampling_params,
            "rid": rid,
        }
        status, body = await self._post_generate(orjson.dumps(payload))
        raise_for_generate_status(status, body)
        try:
            data = orjson.loads(body)
        except orjson.JSONDecodeError:
            raise RetryableRequestError("/generate returned a body that is not JSON") from None
        if not isinstance(data, dict):
            raise RetryableRequestError(f"/generate returned {type(data).__name__}, not an object")
        return GenerateResult.from_json(data)

    async def get_json(self, path: str) -> Any:
        """GET an info endpoint; any failure is a RetryableRequestError with the reason."""
        try:
            response = await self._http.get(path, timeout=30.0)
        except httpx.TransportError as err:
            raise RetryableRequestError(f"connection error on {path}: {err!r}") from None
        raise_for_generate_status(response.status_code, response.content)
        return orjson.loads(response.content)

    async def server_info(self) -> dict[str, Any]:
        data = await self.get_json("/server_info")
        return data if isinstance(data, dict) else {}

    async def model_info(self) -> dict[str, Any]:
        data = await self.get_json("/model_info")
        return data if isinstance(data, dict) else {}

    async def health_status(self, path: str = "/health_generate", timeout_s: float = 30.0) -> int:
        """HTTP status of a health endpoint, or 0 when nothing answers (refused, reset, timeout)."""
        try:
            response = await self._http.get(path, timeout=timeout_s)
        except httpx.TransportError:
            return 0
        return response.status_code
