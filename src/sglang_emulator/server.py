"""The aiohttp app: SGLang's native HTTP surface backed by the fake model.

Zero-latency requests are answered without awaiting anything after the body is read, which keeps
the emulator far from being a client's bottleneck. Timed requests (latency model, hang faults)
register in ``inflight`` so ``/abort_request`` and duplicate-rid checks can see them.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import orjson
from aiohttp import web

from sglang_emulator.args import SGLANG_VERSION, EmulatorArgs
from sglang_emulator.errors import (
    ApiError,
    GenerateValueError,
    ServiceError,
    ValidationError,
)
from sglang_emulator.fake_model import FakeModel
from sglang_emulator.faults import FaultInjector, FaultKind, FaultRates, is_exempt
from sglang_emulator.latency import LatencyModel, SlotPool, Stats
from sglang_emulator.ledger import Ledger
from sglang_emulator.protocol import (
    ABORTED,
    GenerateRequest,
    IncrementalText,
    Item,
    Limits,
    Result,
    meta_info,
    parse_generate,
    run_item,
    truncate,
)
from sglang_emulator.vocab import Vocab

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

FLUSH_CACHE_TEXT = (
    "Cache flushed.\nPlease check backend logs for more details. "
    "(When there are running or waiting requests, the operation will not be performed.)\n"
)
WAITING_ABORT = {
    "type": "abort",
    "message": "Abort in waiting queue",
    "status_code": None,
    "err_type": None,
}
_PREFIX_CACHE_SIZE = 65536
_STREAM_TICK_S = 0.02  # coarsest sleep between stream chunks; finer gaps are sent at once
_UNAUTH_EXEMPT = ("/health", "/ready", "/metrics")


def log(msg: str, err: bool = False) -> None:
    """One SGLang-style log line, flushed so a launcher tailing the file sees it at once."""
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    print(f"[{stamp}] {msg}", file=sys.stderr if err else sys.stdout, flush=True)


def _json(obj: Any, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(obj), status=status, content_type="application/json")


def _error(e: ApiError) -> web.Response:
    return _json(e.body(), e.status)


class Flight:
    """A timed item in flight: what ``/abort_request`` needs to wake or dequeue it."""

    __slots__ = ("aborted", "item", "queue_fut", "wake")

    def __init__(self, item: Item) -> None:
        self.item = item
        self.aborted = False
        self.wake: asyncio.Future[bool] | None = None
        self.queue_fut: asyncio.Future[bool] | None = None


class Emulator:
    """Server state shared by the handlers."""

    def __init__(self, args: EmulatorArgs, vocab: Vocab) -> None:
        self.args = args
        self.vocab = vocab
        self.model = FakeModel(
            vocab,
            mean_output_tokens=args.emu_mean_output_tokens,
            max_output_tokens=args.emu_max_output_tokens,
            sigma=args.emu_output_sigma,
            tool_call_rate=args.emu_tool_call_rate,
        )
        context = args.context_length or vocab.meta.context_length
        max_total = args.emu_max_total_tokens or 4 * context
        self.limits = Limits(context, max_total, vocab.meta.vocab_size)
        self.seed: int = args.random_seed if args.random_seed is not None else 0
        self.latency = LatencyModel(args.emu_prefill_tokens_per_s, args.emu_decode_ms_per_token)
        slots = args.emu_running_slots or args.max_running_requests or None
        self.stats = Stats(slots)
        self.pool = SlotPool(slots, self.stats)
        rates = FaultRates(
            r400=args.emu_fault_400_rate,
            r500=args.emu_fault_500_rate,
            r503=args.emu_fault_503_rate,
            reset=args.emu_fault_reset_rate,
            hang=args.emu_fault_hang_rate,
            abort=args.emu_fault_abort_rate,
        )
        self.faults = FaultInjector(rates, args.emu_fault_seed, args.emu_crash_after)
        self.ledger = Ledger(args.emu_ledger) if args.emu_ledger else None
        self.ready = False
        self.inflight: dict[str, Flight] = {}
        self.prefix_cache: OrderedDict[bytes, None] = OrderedDict()
        self.totals = {"requests": 0, "prompt_tokens": 0, "generation_tokens": 0, "cached": 0}
        self.startup_time = time.time()
        self.served_model_name: str = args.served_model_name or args.model_path

    # ----- app -----

    def build_app(self) -> web.Application:
        middlewares = [self._auth_middleware] if self.args.api_key else []
        app = web.Application(middlewares=middlewares, client_max_size=1 << 30)
        r = app.router
        r.add_post("/generate", self.generate)
        r.add_put("/generate", self.generate)
        for path in ("/health", "/health_generate", "/ready"):
            r.add_get(path, self.health)
        r.add_get("/model_info", self.model_info)
        r.add_get("/get_model_info", self.model_info)
        r.add_get("/server_info", self.server_info)
        r.add_get("/get_server_info", self.server_info)
        r.add_get("/v1/models", self.models)
        r.add_get("/flush_cache", self.flush_cache)
        r.add_post("/flush_cache", self.flush_cache)
        r.add_post("/abort_request", self.abort_request)
        if self.args.enable_metrics:
            r.add_get("/metrics", self.metrics)
        r.add_get("/emulator/stats", self.emulator_stats)
        r.add_post("/emulator/reset_stats", self.emulator_reset_stats)
        r.add_route("*", "/{tail:.*}", self.not_found)
        return app

    @web.middleware
    async def _auth_middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """SGLang's api-key check: health, readiness and metrics stay open for probes."""
        path = request.path
        if request.method == "OPTIONS" or path.startswith(_UNAUTH_EXEMPT):
            return await handler(request)
        header = request.headers.get("Authorization", "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or token != self.args.api_key:
            return _json({"error": "Unauthorized"}, 401)
        return await handler(request)

    async def not_found(self, request: web.Request) -> web.Response:
        known = {str(res.canonical) for res in request.app.router.resources()}
        if request.path in known:
            return _json({"detail": "Method Not Allowed"}, 405)
        return _json({"detail": "Not Found"}, 404)

    # ----- info endpoints -----

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(status=200 if self.ready else 503)

    def model_info_dict(self) -> dict[str, Any]:
        a = self.args
        return {
            "model_path": a.model_path,
            "served_model_name": self.served_model_name,
            "tokenizer_path": a.tokenizer_path or a.model_path,
            "is_generation": True,
            "preferred_sampling_params": None,
            "weight_version": "default",
            "load_format": "auto",
            "reasoning_parser": a.reasoning_parser,
            "tool_call_parser": a.tool_call_parser,
            "disaggregation_mode": "null",
            "has_image_understanding": False,
            "has_audio_understanding": False,
            "model_type": self.vocab.meta.model_type,
            "architectures": self.vocab.meta.architectures,
        }

    async def model_info(self, request: web.Request) -> web.Response:
        return _json(self.model_info_dict())

    def server_args_dict(self) -> dict[str, Any]:
        """The resolved server args, flat like ``ServerArgs``; the api key is never reported."""
        a = self.args
        skip = {"api_key", "admin_api_key", "model_path", "tokenizer_path"}
        flags = {k: v for k, v in vars(a.ns).items() if k not in skip}
        return {
            "model_path": a.model_path,
            "tokenizer_path": a.tokenizer_path or a.model_path,
            "tokenizer_mode": "auto",
            "load_format": "auto",
            "dtype": "auto",
            "is_embedding": False,
            "pp_size": 1,
            "schedule_policy": "fcfs",
            "max_prefill_tokens": 16384,
            **flags,
            "served_model_name": self.served_model_name,
            "mem_fraction_static": a.mem_fraction_static
            if a.mem_fraction_static is not None
            else 0.85,
            "chunked_prefill_size": a.chunked_prefill_size
            if a.chunked_prefill_size is not None
            else 8192,
            "hicache_ratio": a.hicache_ratio if a.hicache_ratio is not None else 2.0,
            "random_seed": self.seed,
            "api_key": None,
            "admin_api_key": None,
        }

    async def server_info(self, request: web.Request) -> web.Response:
        args = self.server_args_dict()
        limits = self.limits
        per_dp = self.pool.slots or self.args.max_running_requests or 4096
        internal = {
            **args,
            "last_gen_throughput": 0.0,
            "memory_usage": {
                "weight": 0.0,
                "kvcache": 0.0,
                "token_capacity": limits.max_total_num_tokens,
                "graph": 0.0,
            },
            "effective_max_running_requests_per_dp": per_dp,
        }
        info = {
            **args,
            "launch_command": self.args.launch_command,
            "max_total_num_tokens": limits.max_total_num_tokens,
            "max_req_input_len": limits.max_req_input_len,
            "kv_events": None,
            "startup_time": self.startup_time,
            "internal_states": [internal for _ in range(max(1, self.args.dp_size))],
            "version": SGLANG_VERSION,
            "frontend": "python",
            "emulator": True,
            "emulator_unknown_args": self.args.unknown_redacted,
            "model_context_length": limits.context_len,
        }
        return _json(info)

    async def models(self, request: web.Request) -> web.Response:
        card = {
            "id": self.served_model_name,
            "object": "model",
            "created": int(self.startup_time),
            "owned_by": "sglang",
            "root": self.served_model_name,
            "parent": None,
            "max_model_len": self.limits.context_len,
        }
        return _json({"object": "list", "data": [card]})

    async def flush_cache(self, request: web.Request) -> web.Response:
        self.prefix_cache.clear()
        return web.Response(text=FLUSH_CACHE_TEXT, content_type="text/plain")

    async def abort_request(self, request: web.Request) -> web.Response:
        """Abort in-flight requests whose rid starts with ``rid`` (or all with ``abort_all``)."""
        try:
            body = orjson.loads(await request.read())
        except orjson.JSONDecodeError as e:
            return _error(ValidationError(f"JSON decode error: {e}"))
        if not isinstance(body, dict):
            return _error(ValidationError("Input should be a valid dictionary"))
        rid = body.get("rid") or ""
        abort_all = bool(body.get("abort_all"))
        if not isinstance(rid, str):
            return _error(ValidationError("rid: Input should be a valid string"))
        if abort_all or rid:
            for flight in list(self.inflight.values()):
                if abort_all or flight.item.rid.startswith(rid):
                    self._abort(flight)
        return web.Response(status=200)

    def _abort(self, flight: Flight) -> None:
        flight.aborted = True
        fut = flight.queue_fut
        if fut is not None and not fut.done():
            self.pool.leave_queue(fut)
            fut.set_result(False)
        wake = flight.wake
        if wake is not None and not wake.done():
            wake.set_result(True)

    async def metrics(self, request: web.Request) -> web.Response:
        label = f'{{model_name="{self.served_model_name}"}}'
        t = self.totals
        rows = [
            ("num_running_reqs", "gauge", self.stats.running),
            ("num_queue_reqs", "gauge", self.stats.queued),
            ("token_usage", "gauge", 0.0),
            ("gen_throughput", "gauge", 0.0),
            (
                "cache_hit_rate",
                "gauge",
                t["cached"] / t["prompt_tokens"] if t["prompt_tokens"] else 0.0,
            ),
            ("prompt_tokens_total", "counter", t["prompt_tokens"]),
            ("generation_tokens_total", "counter", t["generation_tokens"]),
            ("num_requests_total", "counter", t["requests"]),
        ]
        lines = []
        for name, kind, value in rows:
            lines.append(f"# HELP sglang:{name} {name.replace('_', ' ')}.")
            lines.append(f"# TYPE sglang:{name} {kind}")
            lines.append(f"sglang:{name}{label} {float(value)}")
        return web.Response(text="\n".join(lines) + "\n", content_type="text/plain")

    async def emulator_stats(self, request: web.Request) -> web.Response:
        return _json(self.stats.snapshot())

    async def emulator_reset_stats(self, request: web.Request) -> web.Response:
        self.stats.reset()
        return _json(self.stats.snapshot())

    # ----- /generate -----

    async def generate(self, request: web.Request) -> web.StreamResponse:
        t0 = time.monotonic()
        self.stats.http_request()
        try:
            body = orjson.loads(await request.read())
        except orjson.JSONDecodeError as e:
            self.stats.errors_4xx += 1
            err = {
                "type": "json_invalid",
                "loc": ("body", 0),
                "msg": "JSON decode error",
                "input": {},
                "ctx": {"error": str(e)},
            }
            return _error(ValidationError(str([err])))
        exempt = isinstance(body, dict) and is_exempt(body.get("rid"))
        if not exempt and self.faults.count_and_check_crash():
            log(
                f"emulator: crashing on /generate request #{self.faults.counted} "
                "(--emu-crash-after)",
                err=True,
            )
            os._exit(1)
        try:
            req = parse_generate(body, self.vocab, self.limits, self.seed, self.inflight)
        except GenerateValueError as e:
            self.stats.errors_4xx += 1
            if isinstance(body, dict) and body.get("stream") is True:
                return await self._stream_error(request, e)
            return _error(e)
        except ApiError as e:
            self.stats.errors_4xx += 1
            return _error(e)

        fault = None if exempt else self.faults.draw()
        if fault is not None:
            self.stats.fault(fault)
            early = self._early_fault(request, fault)
            if early is not None:
                return early
        self.stats.requests += len(req.items)
        if req.stream:
            return await self._stream(request, req, fault, t0)
        if self.latency.is_zero and fault != "hang":
            results = [self._run_now(item, fault) for item in req.items]
        else:
            try:
                results = list(
                    await asyncio.gather(*(self._run_timed(it, fault) for it in req.items))
                )
            except ServiceError as e:
                return _error(e)
        echo = req.return_prompt_token_ids
        outs = [
            self._finish(item, res, t0, echo) for item, res in zip(req.items, results, strict=True)
        ]
        return _json(outs[0] if req.is_single else outs)

    def _early_fault(self, request: web.Request, fault: FaultKind) -> web.Response | None:
        """Faults answered before any generation; None for hang/abort, which come later."""
        if fault == "400":
            return _json({"error": {"message": "Emulated fault: bad request."}}, 400)
        if fault == "500":
            return web.Response(status=500, text="Internal Server Error")
        if fault == "503":
            return _error(ServiceError("The request queue is full.", 503))
        if fault == "reset":
            transport = request.transport
            if transport is not None:
                transport.abort()  # RST: the client sees a dropped connection, no response
            return web.Response(status=500)
        return None

    def _run_now(self, item: Item, fault: FaultKind | None) -> Result:
        result = run_item(item, self.model, self.vocab)
        if fault == "abort":
            keep = self.faults.abort_keep(item.digest, len(result.output_ids))
            result = truncate(result, keep, self.vocab, item.sampling, ABORTED)
        return result

    def _cached_tokens(self, item: Item) -> int:
        """Exact-repeat prefix caching: a prompt seen before counts all but its last token."""
        key = item.digest
        if key in self.prefix_cache:
            self.prefix_cache.move_to_end(key)
            return len(item.input_ids) - 1
        self.prefix_cache[key] = None
        if len(self.prefix_cache) > _PREFIX_CACHE_SIZE:
            self.prefix_cache.popitem(last=False)
        return 0

    def _finish(
        self, item: Item, result: Result, t0: float, echo_prompt: bool = False
    ) -> dict[str, Any]:
        """Account for a finished item, write its ledger line, and build its response object."""
        n_out = len(result.output_ids)
        n_in = len(item.input_ids)
        cached = self._cached_tokens(item)
        self.stats.finish(result.finish_reason["type"], n_in, n_out)
        t = self.totals
        t["requests"] += 1
        t["prompt_tokens"] += n_in
        t["generation_tokens"] += n_out
        t["cached"] += cached
        if self.ledger is not None:
            self.ledger.write(
                item.rid, item.digest.hex(), n_in, result.output_ids, result.finish_reason
            )
        if self.args.log_requests:
            log(
                f"Finish: rid={item.rid}, prompt_tokens={n_in}, completion_tokens={n_out}, "
                f"finish_reason={orjson.dumps(result.finish_reason).decode()}"
            )
        meta = meta_info(item, result.output_ids, result.finish_reason, cached)
        meta["e2e_latency"] = time.monotonic() - t0
        meta["response_sent_to_client_ts"] = time.time()
        out = {"text": result.text, "output_ids": result.output_ids, "meta_info": meta}
        if echo_prompt:  # v0.5.23 return_prompt_token_ids
            out["prompt_token_ids"] = item.input_ids
        return out

    async def _sleep(self, flight: Flight, seconds: float) -> bool:
        """Sleep unless aborted first; True if ``/abort_request`` woke us."""
        if flight.aborted:
            return True
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[bool] = loop.create_future()
        flight.wake = fut
        handle = loop.call_later(seconds, _resolve, fut, False)
        try:
            return await fut
        finally:
            handle.cancel()
            flight.wake = None

    async def _take_slot(self, flight: Flight) -> bool:
        """Wait for a decode slot; False if aborted while queued."""
        if self.pool.try_acquire():
            return True
        limit = self.args.max_queued_requests
        if limit is not None and self.stats.queued >= limit:
            raise ServiceError("The request queue is full.", 503)
        fut = self.pool.waiter()
        flight.queue_fut = fut
        try:
            return await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled() and fut.result():
                self.pool.release()
            else:
                self.pool.leave_queue(fut)
            raise
        finally:
            flight.queue_fut = None

    def _register(self, item: Item) -> Flight:
        flight = Flight(item)
        self.inflight[item.rid] = flight
        return flight

    def _unregister(self, flight: Flight) -> None:
        if self.inflight.get(flight.item.rid) is flight:
            del self.inflight[flight.item.rid]

    async def _run_timed(self, item: Item, fault: FaultKind | None) -> Result:
        """Hang, queue for a slot, then hold it for prefill + decode time (abortable)."""
        flight = self._register(item)
        s = item.sampling
        try:
            if fault == "hang" and await self._sleep(flight, self.args.emu_hang_s):
                return Result([], dict(ABORTED), "")
            if not await self._take_slot(flight):
                return Result([], dict(WAITING_ABORT), "")
            try:
                result = self._run_now(item, fault)
                prefill = self.latency.prefill_s(len(item.input_ids))
                total = prefill + self.latency.decode_s(len(result.output_ids))
                started = time.monotonic()
                if total > 0 and await self._sleep(flight, total):
                    per_tok = self.latency.decode_ms_per_token / 1000.0
                    done = time.monotonic() - started - prefill
                    keep = int(done / per_tok) if per_tok > 0 and done > 0 else 0
                    keep = min(keep, len(result.output_ids))
                    result = truncate(result, keep, self.vocab, s, ABORTED)
                elif flight.aborted:
                    result = truncate(result, 0, self.vocab, s, ABORTED)
                return result
            finally:
                self.pool.release()
        except asyncio.CancelledError:
            self.stats.finish("disconnect", len(item.input_ids), 0)
            raise
        finally:
            self._unregister(flight)

    # ----- streaming -----

    async def _stream_error(self, request: web.Request, e: ApiError) -> web.StreamResponse:
        resp = _sse_response()
        await resp.prepare(request)
        err = {
            "error": {
                "message": e.message,
                "type": "invalid_request_error",
                "code": e.status,
                "retryable": False,
            }
        }
        await resp.write(b"data: " + orjson.dumps(err) + b"\n\n")
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    async def _stream(
        self, request: web.Request, req: GenerateRequest, fault: FaultKind | None, t0: float
    ) -> web.StreamResponse:
        """SSE with cumulative ``text``/``output_ids``; items of a batch are streamed in turn."""
        resp = _sse_response()
        await resp.prepare(request)
        try:
            for item in req.items:
                index = None if req.is_single else item.index
                try:
                    await self._stream_item(resp, item, fault, index, t0)
                except ServiceError as e:
                    reason = {
                        "type": "abort",
                        "message": e.message,
                        "status_code": e.status,
                        "err_type": None,
                    }
                    out = self._finish(item, Result([], reason, ""), t0)
                    await resp.write(_chunk(out, index))
            await resp.write(b"data: [DONE]\n\n")
            await resp.write_eof()
        except ConnectionError:
            pass  # the client went away mid-stream; its slot is already released
        return resp

    async def _stream_item(
        self,
        resp: web.StreamResponse,
        item: Item,
        fault: FaultKind | None,
        index: int | None,
        t0: float,
    ) -> None:
        flight = self._register(item)
        s = item.sampling
        vocab = self.vocab
        try:
            if fault == "hang" and await self._sleep(flight, self.args.emu_hang_s):
                await resp.write(
                    _chunk(self._finish(item, Result([], dict(ABORTED), ""), t0), index)
                )
                return
            if not await self._take_slot(flight):
                final = Result([], dict(WAITING_ABORT), "")
                await resp.write(_chunk(self._finish(item, final, t0), index))
                return
            try:
                final = self._run_now(item, fault)
                ids = final.output_ids
                interval = max(1, s.stream_interval or self.args.stream_interval or 1)
                per_tok = self.latency.decode_ms_per_token / 1000.0
                loop = asyncio.get_running_loop()
                start = loop.time() + self.latency.prefill_s(len(item.input_ids))
                text = IncrementalText(vocab, s.skip_special_tokens)
                k = 0
                while k < len(ids):
                    nxt = min(len(ids), k + interval)
                    delay = start + nxt * per_tok - loop.time()
                    due = delay > _STREAM_TICK_S or (delay > 0 and nxt == len(ids))
                    if (due and await self._sleep(flight, delay)) or flight.aborted:
                        done = loop.time() - start
                        made = int(done / per_tok) if per_tok > 0 and done > 0 else 0
                        # never fewer ids than the chunks already sent
                        final = truncate(final, max(k, min(len(ids), made)), vocab, s, ABORTED)
                        break
                    if nxt < len(ids):
                        part = ids[:nxt]
                        out = {
                            "text": text.advance(ids, nxt),
                            "output_ids": part,
                            "meta_info": meta_info(item, part, None, 0),
                        }
                        await resp.write(_chunk(out, index))
                    k = nxt
            finally:
                self.pool.release()
            await resp.write(_chunk(self._finish(item, final, t0), index))
        except asyncio.CancelledError:
            self.stats.finish("disconnect", len(item.input_ids), 0)
            raise
        finally:
            self._unregister(flight)


def _resolve(fut: asyncio.Future[bool], value: bool) -> None:
    if not fut.done():
        fut.set_result(value)


def _sse_response() -> web.StreamResponse:
    return web.StreamResponse(
        status=200, headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
    )


def _chunk(out: dict[str, Any], index: int | None) -> bytes:
    if index is not None:
        out["index"] = index
    return b"data: " + orjson.dumps(out) + b"\n\n"


def resolve_model_path(path: str) -> Path:
    return Path(path).expanduser()
