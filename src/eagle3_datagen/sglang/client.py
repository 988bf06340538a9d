"""Async client for SGLang's native HTTP API (``/generate``, ``/server_info``, health).

The HTTP stack is aiohttp: maintained, and the cheapest on the client's CPU of the stacks
measured (``benchmarks/transports.py``; the pipeline's client CPU per record stays well under
1 ms with it). Bodies are encoded and decoded with orjson (decoding a 200-token answer: 8 us,
``json`` 25 us).

One race aiohttp leaves to us: SGLang's uvicorn closes a keep-alive connection after 5 idle
seconds, and when the client's event loop is busy (rendering prompts, writing Parquet) it can
send a request on a connection whose close it has not noticed yet. A POST that fails that way,
on a reused connection and before any answer, is sent once more on a fresh connection: the
server never read it, and a blip of ours must not count toward "server lost".

HTTP status maps to our error types in exactly one place, :func:`raise_for_generate_status`.
"""

from __future__ import annotations

import weakref
from abc import ABC, abstractmethod
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Self

import aiohttp
import orjson
from aiohttp.connector import Connection
from aiohttp.tracing import Trace

from eagle3_datagen.errors import (
    AuthenticationError,
    RejectedRequestError,
    RetryableRequestError,
)
from eagle3_datagen.sglang.logprobs import parse_logprobs, request_fields
from eagle3_datagen.sglang.speculative import META_FIELDS

# uvicorn (SGLang's HTTP server) closes idle connections after 5 s; reusing one it is closing
# produces spurious "server disconnected" errors, so expire ours first.
KEEPALIVE_EXPIRY_S = 4.0
CONNECT_TIMEOUT_S = 30.0
RETRYABLE_STATUS = frozenset({408, 429, 500, 502, 503, 504})
# SGLang 0.5.23 answers 400 to a rid it still holds (tokenizer_manager.py, "Duplicate request ID
# detected"): the earlier request with that rid is still being aborted. Not the prompt's fault.
_DUPLICATE_RID = "duplicate request id"


@dataclass(frozen=True, slots=True)
class GenerateRequest:
    """One ``/generate`` request: a prompt as token ids, its sampling, its rid; its images, if
    any, in placeholder order; ``top_logprobs``: ask for the output logprobs with that many
    alternatives per token (None: none). What every client's ``generate`` takes."""

    input_ids: list[int]
    sampling_params: dict[str, Any]
    rid: str
    image_data: list[str] | None = None
    top_logprobs: int | None = None


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
    # Times SGLang retracted it (its KV pool ran out; 0.5.23 reports it in meta_info).
    num_retractions: int = 0
    # The speculative decoding fields of meta_info, as sent (speculative.META_FIELDS); None
    # when there are none: the server does not speculate, or the request had no verify step.
    spec: dict[str, Any] | None = None
    # Asked for with ``logprobs`` (sglang/logprobs.py), as sent: the sampled token's logprob
    # and the id SGLang scored per output token; with top_k > 0 the alternatives, highest first.
    # None when not asked. A null logprob is SGLang's JSON for NaN.
    output_logprobs: list[float | None] | None = None
    logprob_ids: list[int] | None = None
    top_logprob_ids: list[list[int]] | None = None
    top_logprobs: list[list[float]] | None = None  # entries of no mass dropped (logprobs.py)

    @classmethod
    def from_json(cls, item: dict[str, Any], top_k: int | None = None) -> GenerateResult:
        """Parse one response item (``top_k``: the logprobs asked for, None: none); a
        malformed body is a retryable server fault."""
        try:
            meta = item["meta_info"]
            output_ids = item["output_ids"]
            finish = meta.get("finish_reason") or {}
            result = cls(
                rid=str(meta.get("id", "")),
                output_ids=output_ids,
                finish_type=str(finish.get("type", "abort")),
                finish_matched=finish.get("matched"),
                finish_message=finish.get("message"),
                prompt_tokens=int(meta["prompt_tokens"]),
                completion_tokens=int(meta.get("completion_tokens", len(output_ids))),
                cached_tokens=int(meta.get("cached_tokens", 0)),
                e2e_latency=meta.get("e2e_latency"),
                num_retractions=int(meta.get("num_retractions") or 0),
                spec={k: meta[k] for k in META_FIELDS if k in meta}
                if "spec_verify_ct" in meta
                else None,
            )
            # An abort may end before any logprob (the caller retries or rejects it anyway).
            if top_k is not None and (
                result.finish_type != "abort" or "output_token_logprobs" in meta
            ):
                lp = parse_logprobs(meta, top_k)
                result.output_logprobs, result.logprob_ids = lp.logprobs, lp.token_ids
                result.top_logprob_ids, result.top_logprobs = lp.top_ids, lp.top_logprobs
            return result
        except (KeyError, TypeError, ValueError, AttributeError, IndexError) as err:
            raise RetryableRequestError(f"malformed /generate response: {err!r}") from None


def generate_body(
    input_ids: list[int],
    sampling_params: dict[str, Any],
    rid: str,
    image_data: list[str] | None = None,
    top_logprobs: int | None = None,
) -> dict[str, Any]:
    """The ``/generate`` body of one prompt (its recorded answers from SGLang's own code are
    tests/fixtures/sglang-0.5.23/generate_*.json)."""
    payload: dict[str, Any] = {
        "input_ids": input_ids,
        "sampling_params": sampling_params,
        "rid": rid,
    }
    if image_data:
        payload["image_data"] = image_data
    if top_logprobs is not None:
        payload.update(request_fields(top_logprobs))
    return payload


def request_id(run_id: str, partition: str, line: int | str, attempt: int) -> str:
    """The rid of one try: unique per run and attempt, so no two requests ever share one.

    SGLang refuses a rid it still holds (a cancelled run's request being aborted, a batch retry
    while its siblings drain), so ``partition:line:attempt`` alone is not enough across runs.
    """
    return f"{run_id}:{partition}:{line}:{attempt}"


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
    """Map an HTTP status to our error types: 4xx rejects the prompt, 429/5xx are retried,
    401/403 (a refused API key) stops the run.

    A 400 for a duplicate rid is retried too: the next try has another rid, and the prompt was
    never looked at.
    """
    if status == 200:
        return
    message = _error_message(body)
    if status in RETRYABLE_STATUS or (status == 400 and _DUPLICATE_RID in message.lower()):
        raise RetryableRequestError(f"HTTP {status}: {message}", status=status)
    if status in (401, 403):
        # Not the prompt's fault: a wrong key fails every request alike, so the run stops.
        raise AuthenticationError(
            f"HTTP {status}: the server refused the API key (check server.api_key_env or "
            f"server.api_key_secret): {message}",
            status=status,
        )
    raise RejectedRequestError(f"HTTP {status}: {message}", status=status)


_reused: ContextVar[bool] = ContextVar("sglang_connection_reused", default=False)


class _Connector(aiohttp.TCPConnector):
    """A TCP connector that notes, for the request in progress, whether its connection is a
    kept-alive one that served a request before (see the module doc for why)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._served: weakref.WeakSet[object] = weakref.WeakSet()

    async def connect(
        self,
        req: aiohttp.ClientRequest,
        traces: list[Trace],
        timeout: aiohttp.ClientTimeout,  # noqa: ASYNC109 (aiohttp's own signature)
    ) -> Connection:
        conn = await super().connect(req, traces, timeout)
        protocol = conn.protocol
        if protocol is not None:
            _reused.set(protocol in self._served)
            self._served.add(protocol)
        return conn


def _stale(err: aiohttp.ClientError) -> bool:
    """A failure of a reused connection before any answer: the server had closed it."""
    if isinstance(err, aiohttp.ServerDisconnectedError):
        return isinstance(err.message, str)  # otherwise part of an answer had arrived
    return isinstance(err, aiohttp.ClientOSError) and not isinstance(
        err, aiohttp.ClientConnectorError
    )


class ClosedOnExit(ABC):
    """``async with x:`` closes ``x`` (its ``aclose``) on the way out, whatever happened inside."""

    @abstractmethod
    async def aclose(self) -> None: ...

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()


class SGLangClient(ClosedOnExit):
    """One connection pool to one SGLang server (or router). Use as an async context manager.

    The aiohttp session is made on first use, on the event loop that uses it (a session cannot
    cross event loops).
    """

    def __init__(
        self,
        base_url: str,
        *,
        api_key: str | None = None,
        timeout_s: float = 1800.0,
        max_connections: int = 256,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self._headers = {"Content-Type": "application/json"}
        if api_key:
            self._headers["Authorization"] = f"Bearer {api_key}"
        self._max_connections = max_connections
        # No byte for timeout_s (a long generation answers only at the end), 30 s to connect.
        self._timeout = aiohttp.ClientTimeout(
            total=None, connect=timeout_s, sock_connect=CONNECT_TIMEOUT_S, sock_read=timeout_s
        )
        self._generate_url = self.base_url + "/generate"
        self._session: aiohttp.ClientSession | None = None
        self._fresh: aiohttp.ClientSession | None = None  # one request per connection

    def _new_session(self, connector: aiohttp.BaseConnector) -> aiohttp.ClientSession:
        return aiohttp.ClientSession(
            connector=connector,
            headers=self._headers,
            timeout=self._timeout,
            cookie_jar=aiohttp.DummyCookieJar(),
            trust_env=False,
        )

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = self._new_session(
                _Connector(limit=self._max_connections, keepalive_timeout=KEEPALIVE_EXPIRY_S)
            )
        return self._session

    @property
    def fresh_session(self) -> aiohttp.ClientSession:
        if self._fresh is None:
            self._fresh = self._new_session(aiohttp.TCPConnector(force_close=True))
        return self._fresh

    async def aclose(self) -> None:
        for session in (self._session, self._fresh):
            if session is not None:
                await session.close()
        self._session = self._fresh = None

    async def _post(self, session: aiohttp.ClientSession, body: bytes) -> tuple[int, bytes]:
        async with session.post(self._generate_url, data=body) as response:
            return response.status, await response.read()

    async def _post_generate(self, body: bytes) -> tuple[int, bytes]:
        """POST /generate; a stale kept-alive connection is replaced once (module doc)."""
        _reused.set(False)
        try:
            try:
                return await self._post(self.session, body)
            except aiohttp.ClientError as err:
                if not (_reused.get() and _stale(err)):
                    raise
            return await self._post(self.fresh_session, body)
        except TimeoutError as err:
            raise RetryableRequestError(f"timeout on /generate: {err!r}") from None
        except aiohttp.ClientError as err:
            raise RetryableRequestError(f"connection error on /generate: {err!r}") from None

    async def generate(self, request: GenerateRequest) -> GenerateResult:
        """Send one request; return the raw output ids and finish reason (and the logprobs,
        when it asks for them)."""
        r = request
        payload = generate_body(r.input_ids, r.sampling_params, r.rid, r.image_data, r.top_logprobs)
        status, body = await self._post_generate(orjson.dumps(payload))
        raise_for_generate_status(status, body)
        try:
            data = orjson.loads(body)
        except orjson.JSONDecodeError:
            raise RetryableRequestError("/generate returned a body that is not JSON") from None
        if not isinstance(data, dict):
            raise RetryableRequestError(f"/generate returned {type(data).__name__}, not an object")
        return GenerateResult.from_json(data, r.top_logprobs)

    async def _get(self, path: str, timeout_s: float) -> tuple[int, bytes]:
        timeout = aiohttp.ClientTimeout(total=timeout_s)
        async with self.session.get(self.base_url + path, timeout=timeout) as response:
            return response.status, await response.read()

    async def get_json(self, path: str) -> Any:
        """GET an info endpoint; any failure is a RetryableRequestError with the reason."""
        try:
            status, body = await self._get(path, 30.0)
        except (aiohttp.ClientError, TimeoutError) as err:
            raise RetryableRequestError(f"connection error on {path}: {err!r}") from None
        raise_for_generate_status(status, body)
        try:
            return orjson.loads(body)
        except orjson.JSONDecodeError:
            raise RetryableRequestError(f"{path} returned a body that is not JSON") from None

    async def server_info(self) -> dict[str, Any]:
        data = await self.get_json("/server_info")
        return data if isinstance(data, dict) else {}

    async def model_info(self) -> dict[str, Any]:
        data = await self.get_json("/model_info")
        return data if isinstance(data, dict) else {}

    async def health_status(self, path: str = "/health_generate", timeout_s: float = 30.0) -> int:
        """HTTP status of a health endpoint, or 0 when nothing answers (refused, reset, timeout)."""
        try:
            status, _ = await self._get(path, timeout_s)
        except (aiohttp.ClientError, TimeoutError):
            return 0
        return status
