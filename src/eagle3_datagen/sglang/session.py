"""One context manager for "a usable server": launch or attach, health gate, pre-flight, recovery.

Launch mode starts the configured engine (SGLang, or the emulator with the same flags), reaps
servers orphaned by earlier killed runs, waits for health and stops the server on exit, whatever
the exit; if the server is lost mid-run it is relaunched (bounded). Attach mode runs the same
gate and checks, waits for a lost server to come back, and never stops a server it did not start.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import asynccontextmanager
from dataclasses import dataclass
from functools import partial
from typing import Any

from eagle3_datagen.config import PipelineConfig, ServerSpec
from eagle3_datagen.errors import ServerError
from eagle3_datagen.processes import free_port
from eagle3_datagen.sglang.budget import ServerBudget
from eagle3_datagen.sglang.client import SGLangClient
from eagle3_datagen.sglang.concurrency import ConcurrencyController
from eagle3_datagen.sglang.health import ATTACH_REFUSED_S, LogSink, wait_until_healthy
from eagle3_datagen.sglang.launch_command import resolve_api_key
from eagle3_datagen.sglang.load import LoadReader
from eagle3_datagen.sglang.orphans import reap_orphans
from eagle3_datagen.sglang.pool import split_urls
from eagle3_datagen.sglang.preflight import ServerFacts, preflight
from eagle3_datagen.sglang.process import ServerProcess, server_state_dir
from eagle3_datagen.sglang.spec_preflight import check_before_launch
from eagle3_datagen.sglang.supervisor import ServerSupervisor


async def _gate_any(
    gate: Callable[[float, str], Coroutine[Any, Any, ServerFacts]],
    urls: list[str],
    deadline_s: float,
) -> ServerFacts:
    """A pool is back when any of its servers passes the gate within the deadline (the pool
    sets aside the others by itself); raises ServerError when none does."""
    tasks = [asyncio.create_task(gate(deadline_s, one)) for one in urls]
    errors: list[str] = []
    try:
        for next_done in asyncio.as_completed(tasks):
            try:
                return await next_done
            except ServerError as err:
                errors.append(str(err))
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    raise ServerError(
        f"none of the {len(urls)} servers passed the health gate: " + "; ".join(errors)
    )


@dataclass(slots=True)
class ServerSession:
    """A server that passed the gate: where it is and what it reported about itself."""

    url: str
    facts: ServerFacts
    launched: bool
    # What the run's requests go through: the server-wide budget, and the supervisor that
    # notices a lost server (for a pool: every server of it lost) and is the run's one stop.
    budget: ServerBudget
    supervisor: ServerSupervisor
    # concurrency: auto's controller (None without an auto tier); its ``changes`` are the
    # limit-changes table, its ``on_change`` the caller's hook for each new row.
    controller: ConcurrencyController | None
    display_cmd: str | None
    log_path: str | None


class _Gate:
    """The health gate and pre-flight checks a server passes (at start, and when it is back
    after being lost), and the launch (or relaunch) of the server this run starts."""

    def __init__(
        self,
        config: PipelineConfig,
        server: ServerSpec,
        *,
        url: str,
        run_key: str,
        logger: LogSink,
        api_key: str | None,
    ) -> None:
        self.config = config
        self.server = server
        self.url = url  # checked when no other is named
        self.run_key = run_key
        self.logger = logger
        self.api_key = api_key
        self.current: ServerProcess | None = None  # the server this run launched

    async def check(
        self, deadline_s: float, at: str | None = None, refused_limit_s: float | None = None
    ) -> ServerFacts:
        """Wait for the server at ``at`` (default: ``url``) to be healthy, then pre-flight it."""
        target = at or self.url
        logger = self.logger
        async with SGLangClient(target, api_key=self.api_key, timeout_s=60.0) as client:
            waited = await wait_until_healthy(
                client,
                deadline_s=deadline_s,
                process=self.current,
                logger=logger,
                refused_limit_s=refused_limit_s,
            )
            logger.info(f"server at {target} healthy after {waited:.1f} s")
            return await preflight(
                client,
                server=self.server,
                model=self.config.model,
                sampling=self.config.sampling,
                retries=self.config.retries,
                logger=logger,
                api_key=self.api_key,
                temperatures=[t for p in self.config.partitions for t in p.temperatures or ()],
            )

    async def launch(self) -> ServerFacts:
        """Stop the server launched before (if any), start a new one, and gate it."""
        if self.current is not None:
            await self.current.astop()
        config = self.config
        check_before_launch(self.server, config.model)  # the draft, before minutes of loading
        self.current = current = ServerProcess.for_spec(
            self.server,
            config.model,
            output_dir=config.output_dir,
            run_key=self.run_key,
            api_key=self.api_key,
        )
        current.start()
        self.logger.info(f"launched server pid {current.pid}: {current.display_cmd}")
        self.logger.info(f"server log: {current.log_path}")
        return await self.check(self.server.limits.startup_timeout_s)

    async def attach(self, attach_url: str) -> ServerFacts:
        """Every server of ``attach_url`` (comma-separated) must pass the gate and the checks;
        the facts are the last one's."""
        facts: ServerFacts | None = None
        for one in split_urls(attach_url):
            self.logger.info(f"attaching to the server at {one}")
            # An attached server already listens (or is down): refused is not "starting".
            facts = await self.check(self.server.limits.startup_timeout_s, one, ATTACH_REFUSED_S)
        if facts is None:
            raise ServerError(f"no server URL in {attach_url!r}")
        return facts


def _server_spec(config: PipelineConfig) -> ServerSpec:
    """The server section as this run uses it: port 0 made a free port, metrics on when a tier
    is 'auto' (the controller reads the server's load there)."""
    server = config.server
    if server.mode == "launch" and server.port == 0:
        server = server.model_copy(update={"port": free_port(server.host)})
    auto = any(t.is_auto for t in config.tiers)
    if auto and not server.enable_metrics:
        server = server.model_copy(update={"enable_metrics": True})  # the controller reads it
    return server


def _supervisor(
    gate: _Gate, url: str, server: ServerSpec, logger: LogSink, *, launched: bool
) -> ServerSupervisor:
    """The watch that notices a lost server (for a pool: every one of it) and relaunches the
    one this run launched (bounded)."""
    urls = split_urls(url)
    return ServerSupervisor(
        check=gate.check if len(urls) == 1 else partial(_gate_any, gate.check, urls),
        relaunch=gate.launch if launched else None,
        logger=logger,
        failure_threshold=server.recovery.lost_after_failures,
        max_relaunches=server.recovery.max_relaunches,
        check_deadline_s=server.recovery.recovery_check_s,
        name=f"server {url}" if len(urls) == 1 else f"every server of the pool ({', '.join(urls)})",
    )


def _steering(
    config: PipelineConfig,
    server: ServerSpec,
    urls: list[str],
    api_key: str | None,
    logger: LogSink,
) -> tuple[ServerBudget, ConcurrencyController | None]:
    """The server-wide budget, and concurrency: auto's controller (None without an auto tier)."""
    steered = [p.name for p in config.partitions if config.tier(p.tier).is_auto]
    # With auto tiers the controller keeps the server full, so the order requests start in
    # decides the makespan: longest first (sglang/budget.py).
    budget = ServerBudget(
        server.limits.max_requests_in_flight,
        server.limits.max_tokens_in_flight,
        adaptive=steered,
        longest_first=bool(steered),
    )
    if not any(t.is_auto for t in config.tiers):
        return budget, None
    controller = ConcurrencyController(
        budget,
        LoadReader(urls, api_key=api_key),
        server.auto_concurrency,
        log=logger.info,
        warn=logger.warning,
        ceiling=server.limits.max_requests_in_flight,
    )
    logger.info(
        f"concurrency auto: starting at {controller.limit} in flight (server-wide, at most "
        f"{controller.maximum}), "
        f"reading the server's load every {server.auto_concurrency.interval_s:g} s"
    )
    return budget, controller


@asynccontextmanager
async def open_server(
    config: PipelineConfig,
    *,
    run_key: str,
    logger: LogSink,
    server_url: str | None = None,
    api_key: str | None = None,
) -> AsyncIterator[ServerSession]:
    """Yield a healthy, checked server; a launched one is stopped when the block exits.

    ``api_key`` comes from wherever the caller keeps it (e.g. a Prefect Secret block); without
    it, the environment variable named by ``server.api_key_env`` is used. Launch and attach
    share one gate, one recovery path and one exit (the ``finally`` below).
    """
    server = _server_spec(config)
    api_key = api_key or resolve_api_key(server)
    attach_url = server_url or (server.url if server.mode == "attach" else None)
    url = (attach_url or server.base_url).rstrip("/")
    gate = _Gate(config, server, url=url, run_key=run_key, logger=logger, api_key=api_key)
    if attach_url:
        url = gate.url = ",".join(split_urls(attach_url))
        facts = await gate.attach(attach_url)
    else:
        reaped = reap_orphans(server_state_dir(config.output_dir))
        if reaped:
            logger.warning(f"stopped {len(reaped)} server(s) left behind by killed runs: {reaped}")
    supervisor = _supervisor(gate, url, server, logger, launched=not attach_url)
    budget, controller = _steering(config, server, split_urls(url), api_key, logger)
    try:
        if not attach_url:
            facts = await gate.launch()
        current = gate.current
        yield ServerSession(
            url=url,
            facts=facts,
            launched=not attach_url,
            budget=budget,
            supervisor=supervisor,
            controller=controller,
            display_cmd=current.display_cmd if current else None,
            log_path=str(current.log_path) if current else None,
        )
    finally:
        supervisor.stand_down()  # from here on the server is stopped on purpose, never lost
        if controller is not None:
            await controller.aclose()
        await supervisor.aclose()
        if gate.current is not None:
            await gate.current.astop()
