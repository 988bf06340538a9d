"""The aiohttp app: the part of SGLang's native HTTP surface the pipeline uses, backed by the
fake model (``/generate`` with one prompt's ``input_ids``, health, server and model info).

Zero-latency requests are answered without awaiting anything after the body is read, which keeps
the emulator far from being a client's bottleneck. Timed requests (latency model, hang faults)
register their rid in ``inflight`` so a duplicate rid still in flight gets SGLang's 400.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import random
import sys
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import orjson
from aiohttp import web

from sglang_emulator import info
from sglang_emulator.args import SGLANG_VERSION, EmulatorArgs, output_by_max_new
from sglang_emulator.backend import (
    Backend,
    Batcher,
    FakeBackend,
    Generation,
    Scored,
    load_backend,
)
from sglang_emulator.errors import (
    ApiError,
    ServiceError,
    ValidationError,
)
from sglang_emulator.fake_model import FakeModel
from sglang_emulator.faults import FaultInjector, FaultKind, FaultRates, is_exempt
from sglang_emulator.images import KimiImages
from sglang_emulator.latency import LatencyModel, SlotPool, Stats
from sglang_emulator.ledger import Ledger
from sglang_emulator.logprobs import fake_logprobs, real_logprobs, with_logprob_fields
from sglang_emulator.metrics import Observed, load_catalogue, loads_json, prometheus_text
from sglang_emulator.physics import PROFILES
from sglang_emulator.protocol import (
    ABORTED,
    Item,
    Limits,
    Result,
    meta_info,
    parse_generate,
    run_item,
    truncate,
)
from sglang_emulator.scheduler import PhysicsScheduler
from sglang_emulator.speculating import (
    SPEC_MAX_RUNNING_REQUESTS,
    SpecSettings,
    Speculator,
    parse_profile,
    request_seed,
    resolve_settings,
)
from sglang_emulator.vocab import Vocab

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

_PREFIX_CACHE_SIZE = 65536
_UNAUTH_EXEMPT = ("/health", "/ready", "/metrics")  # SGLang's open paths (/health_generate too)


def log(msg: str, err: bool = False) -> None:
    """One SGLang-style log line, flushed so a launcher tailing the file sees it at once."""
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    print(f"[{stamp}] {msg}", file=sys.stderr if err else sys.stdout, flush=True)


def _json(obj: Any, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(obj), status=status, content_type="application/json")


def _error(e: ApiError) -> web.Response:
    return _json(e.body(), e.status)


class Emulator:
    """Server state shared by the handlers."""

    def __init__(self, args: EmulatorArgs, vocab: Vocab) -> None:
        self.args = args
        self.vocab = vocab
        context = args.context_length or vocab.meta.context_length
        profile = PROFILES[args.emu_physics] if args.emu_physics else None
        max_total = args.emu_max_total_tokens or (
            profile.max_total_num_tokens if profile else 4 * context
        )
        self.limits = Limits(context, max_total, vocab.meta.vocab_size)
        # SGLang draws the seed per launch when --random-seed is absent (serving_hook.py).
        self.seed: int = (
            args.random_seed if args.random_seed is not None else random.randint(0, 1 << 30)
        )
        self.latency = LatencyModel(args.emu_prefill_tokens_per_s, args.emu_decode_ms_per_token)
        architectures = vocab.meta.architectures or [""]
        settings = resolve_settings(args.ns, architectures[0])
        self.backend: Backend = (
            load_backend(args.emu_model_backend, args, settings, vocab)
            if args.emu_model_backend
            else _fake_backend(args, vocab)
        )
        self.batcher = Batcher(self.backend) if self.backend.max_batch > 1 else None
        self.speculator = self._speculator(args, settings)
        self.max_running_requests = args.max_running_requests or (
            SPEC_MAX_RUNNING_REQUESTS if self.speculator is not None else None
        )
        slots = args.emu_running_slots or self.max_running_requests or None
        if profile is not None:
            slots = self.max_running_requests or profile.max_running_requests
        self.stats = Stats(slots)
        self.pool = SlotPool(slots, self.stats)
        # --emu-physics: SGLang's scheduler loop instead of the slot pool (scheduler.py).
        self.physics = (
            PhysicsScheduler(
                profile,
                stats=self.stats,
                time_scale=args.emu_time_scale,
                max_running_requests=slots,
                max_total_num_tokens=max_total,
            )
            if profile is not None
            else None
        )
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
        self.inflight: set[str] = set()
        self.prefix_cache: OrderedDict[bytes, None] = OrderedDict()
        self.totals = {"requests": 0, "prompt_tokens": 0, "generation_tokens": 0, "cached": 0}
        self.startup_time = time.time()
        # Kimi-K2.5's image processor settings, when the model directory has them (images.py).
        self.media = KimiImages.load(Path(args.model_path).expanduser())
        self.served_model_name: str = args.served_model_name or args.model_path
        self.observed = (
            Observed(load_catalogue(), self.served_model_name) if args.enable_metrics else None
        )

    @staticmethod
    def _speculator(args: EmulatorArgs, settings: SpecSettings | None) -> Speculator | None:
        """The speculative bookkeeping for the resolved ``--speculative-*`` settings."""
        if settings is None:
            return None
        profile = parse_profile(args.emu_accept_length, args.emu_accept_probs, settings.num_steps)
        return Speculator(settings, profile)

    # ----- app -----

    def build_app(self) -> web.Application:
        middlewares = [self._auth_middleware] if self.args.api_key else []
        if self.observed is not None:  # SGLang's HTTP request counters (--enable-metrics)
            middlewares.insert(0, self._http_metrics_middleware)
        app = web.Application(middlewares=middlewares, client_max_size=1 << 30)
        r = app.router
        r.add_post("/generate", self.generate)
        for path in ("/health", "/health_generate"):
            r.add_get(path, self.health)
        r.add_get("/model_info", self.model_info)
        r.add_get("/server_info", self.server_info)
        r.add_get("/v1/models", self.models)
        r.add_get("/v1/loads", self.v1_loads)
        if self.args.enable_metrics:  # SGLang serves /metrics only with --enable-metrics
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

    @web.middleware
    async def _http_metrics_middleware(
        self, request: web.Request, handler: Handler
    ) -> web.StreamResponse:
        """SGLang's ``http_requests_total``/``_active`` and ``http_responses_total``."""
        assert self.observed is not None
        key = (request.path, request.method)
        seen = self.observed
        seen.requests[key] += 1
        seen.active[key] += 1
        status = 500
        try:
            response = await handler(request)
            status = response.status
            return response
        except web.HTTPException as err:
            status = err.status
            raise
        finally:
            seen.active[key] -= 1
            seen.responses[(*key, status)] += 1

    async def not_found(self, request: web.Request) -> web.Response:
        known = {str(res.canonical) for res in request.app.router.resources()}
        if request.path in known:
            return _json({"detail": "Method Not Allowed"}, 405)
        return _json({"detail": "Not Found"}, 404)

    # ----- info endpoints (their payloads: info.py) -----

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(status=200 if self.ready else 503)

    async def model_info(self, request: web.Request) -> web.Response:
        return _json(info.model_info(self))

    async def server_info(self, request: web.Request) -> web.Response:
        return _json(info.server_info(self))

    async def models(self, request: web.Request) -> web.Response:
        return _json(info.models(self))

    async def metrics(self, request: web.Request) -> web.Response:
        assert self.observed is not None  # the route exists only with --enable-metrics
        body = prometheus_text(info.load_view(self), self.observed)
        return web.Response(text=body, content_type="text/plain", charset="utf-8")

    async def v1_loads(self, request: web.Request) -> web.Response:
        return _json(loads_json(info.load_view(self), SGLANG_VERSION))

    async def emulator_stats(self, request: web.Request) -> web.Response:
        return _json(info.emulator_stats(self))

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
                "loc": ("body", e.pos),
                "msg": "JSON decode error",
                "input": {},
                "ctx": {"error": e.msg},
            }
            # FastAPI's RequestValidationError text, as SGLang 0.5.23's handler renders it.
            return _error(
                ValidationError(
                    f'1 validation error:\n  {err}\n\n  File "sglang/srt/entrypoints/'
                    f'http_server.py", line 928, in generate_request\n    POST /generate [{err}]'
                )
            )
        exempt = isinstance(body, dict) and is_exempt(body.get("rid"))
        if not exempt and self.faults.count_and_check_crash():
            log(
                f"emulator: crashing on /generate request #{self.faults.counted} "
                "(--emu-crash-after)",
                err=True,
            )
            os._exit(1)
        try:
            item = parse_generate(body, self.limits, self.seed, self.inflight, self.media)
        except ApiError as e:
            self.stats.errors_4xx += 1
            return _error(e)

        fault = None if exempt else self.faults.draw()
        if fault is not None:
            self.stats.fault(fault)
            early = self._early_fault(request, fault)
            if early is not None:
                return early
        self.stats.requests += 1
        retractions = 0
        if self.batcher is not None and fault != "hang":
            self.inflight.add(item.rid)
            try:
                result = self._result(item, await self.batcher.submit(item), fault)
            finally:
                self.inflight.discard(item.rid)
        elif self.latency.is_zero and self.physics is None and fault != "hang":
            result = self._run_now(item, fault)
        else:
            try:
                result, retractions = await self._run_timed(item, fault)
            except ServiceError as e:
                return _error(e)
        return _json(self._finish(item, result, t0, retractions))

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
        (generation,) = self.backend.generate([item])
        return self._result(item, generation, fault)

    def _result(self, item: Item, generation: Generation, fault: FaultKind | None) -> Result:
        """SGLang's stop rules on the backend's ids (the abort fault cuts them short)."""
        result = run_item(item, generation.ids, self.vocab)
        result.counters = generation.counters
        result.rows = generation.rows
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
        self, item: Item, result: Result, t0: float, retractions: int = 0
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
        if self.observed is not None:
            self.observed.finished(n_in, cached, n_out, time.monotonic() - t0)
        if self.ledger is not None:
            # the ids the model saw (images expanded); the item's digest also covers the images
            ids_sha = hashlib.sha256(item.packed).hexdigest() if item.images else item.digest.hex()
            self.ledger.write(item.rid, ids_sha, n_in, result.output_ids, result.finish_reason)
        if self.args.log_requests:
            log(
                f"Finish: rid={item.rid}, prompt_tokens={n_in}, completion_tokens={n_out}, "
                f"finish_reason={orjson.dumps(result.finish_reason).decode()}"
            )
        meta = meta_info(item, result.output_ids, result.finish_reason, cached)
        meta["num_retractions"] = retractions
        if item.top_logprobs is not None:
            meta = self._with_logprobs(meta, item, result.output_ids, result.rows)
        meta["e2e_latency"] = time.monotonic() - t0
        if self.speculator is not None:  # after e2e_latency, as tokenizer_manager.py adds them
            if result.counters is not None:  # a real draft's own counts
                meta.update(self.speculator.finish(result.counters))
            else:  # the fake model: drawn from the acceptance profile
                seed = request_seed(item.digest, item.seed)
                meta.update(self.speculator.simulate(n_out, seed, retractions))
        meta["response_sent_to_client_ts"] = time.time()
        return {"text": result.text, "output_ids": result.output_ids, "meta_info": meta}

    def _with_logprobs(
        self,
        meta: dict[str, Any],
        item: Item,
        output_ids: list[int],
        rows: list[Scored] | None = None,
    ) -> dict[str, Any]:
        """``meta`` with the logprob fields where SGLang puts them: after ``num_retractions``
        (tokenizer_manager.py adds them before the token counts). ``rows``: a real model's
        own numbers; without them the fake model's."""
        assert item.top_logprobs is not None
        vocab = self.vocab
        text = (lambda t: vocab.decode([t], False)) if item.logprob_text else None
        if rows is not None:
            fields = real_logprobs(output_ids, rows[: len(output_ids)], item.top_logprobs, text)
            return with_logprob_fields(meta, fields)
        fields = fake_logprobs(
            output_ids,
            item.digest + item.seed.to_bytes(8, "little", signed=True),
            top_k=item.top_logprobs,
            vocab_size=self.limits.vocab_size,
            greedy=item.sampling.greedy,
            text=text,
        )
        return with_logprob_fields(meta, fields)

    async def _take_slot(self) -> None:
        """Wait for a decode slot (503 when ``--max-queued-requests`` are already waiting)."""
        if self.pool.try_acquire():
            return
        limit = self.args.max_queued_requests
        if limit is not None and self.stats.queued >= limit:
            raise ServiceError("The request queue is full.", 503)
        fut = self.pool.waiter()
        try:
            await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled() and fut.result():
                self.pool.release()
            else:
                self.pool.leave_queue(fut)
            raise

    async def _run_timed(self, item: Item, fault: FaultKind | None) -> tuple[Result, int]:
        """Hang, or go through the physics scheduler, or queue for a slot then hold it for
        prefill + decode time; returns the result and its number of retractions."""
        self.inflight.add(item.rid)
        try:
            if fault == "hang":
                await asyncio.sleep(self.args.emu_hang_s)
                return Result([], dict(ABORTED), ""), 0
            if self.physics is not None:
                result = self._run_now(item, fault)
                retractions = await self.physics.run(
                    len(item.input_ids),
                    len(result.output_ids),
                    item.max_new,
                    item.sampling.ignore_eos,
                )
                return result, retractions
            await self._take_slot()
            try:
                result = self._run_now(item, fault)
                prefill = self.latency.prefill_s(len(item.input_ids))
                total = prefill + self.latency.decode_s(len(result.output_ids))
                if total > 0:
                    await asyncio.sleep(total)
                return result, 0
            finally:
                self.pool.release()
        except asyncio.CancelledError:
            self.stats.finish("disconnect", len(item.input_ids), 0)
            raise
        finally:
            self.inflight.discard(item.rid)


def _fake_backend(args: EmulatorArgs, vocab: Vocab) -> FakeBackend:
    """The fake model (one per tier length with ``--emu-output-by-max-new``)."""
    model = FakeModel(
        vocab,
        mean_output_tokens=args.emu_mean_output_tokens,
        max_output_tokens=args.emu_max_output_tokens,
        sigma=args.emu_output_sigma,
        tool_call_rate=args.emu_tool_call_rate,
    )
    # --emu-output-by-max-new: one model per tier length, chosen by max_new_tokens.
    by_max_new = {
        max_new: FakeModel(
            vocab,
            mean_output_tokens=mean,
            max_output_tokens=args.emu_max_output_tokens,
            sigma=args.emu_output_sigma,
            tool_call_rate=args.emu_tool_call_rate,
        )
        for max_new, mean in output_by_max_new(args.emu_output_by_max_new or "").items()
    }
    return FakeBackend(model, by_max_new)


def resolve_model_path(path: str) -> Path:
    return Path(path).expanduser()
