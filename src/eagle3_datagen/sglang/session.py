"""One context manager for "a usable server": launch or attach, health gate, pre-flight, recovery.

Launch mode starts the configured engine (SGLang, or the emulator with the same flags), reaps
servers orphaned by earlier killed runs, waits for health and stops the server on exit, whatever
the exit; if the server is lost mid-run it is relaunched (bounded). Attach mode runs the same
gate and checks, waits for a lost server to come back, and never stops a server it did not start.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import asynccontextmanager
from dataclasses import dataclass
from functools import partial
from typing import Any

from eagle3_datagen.config import PipelineConfig
from eagle3_datagen.errors import ServerError
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


def _free_port(host: str) -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


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
    it, the environment variable named by ``server.api_key_env`` is used.

    Long because launch and attach share one gate, one recovery path and one exit: split, the
    ``finally`` that stops a launched server would sit apart from what it guards.
    """
    server = config.server
    if server.mode == "launch" and server.port == 0:
        server = server.model_copy(update={"port": _free_port(server.host)})
    auto = any(t.is_auto for t in config.tiers)
    if auto and not server.enable_metrics:
        server = server.model_copy(update={"enable_metrics": True})  # the controller reads it
    api_key = api_key or resolve_api_key(server)
    attach_url = server_url or (server.url if server.mode == "attach" else None)
    url = (attach_url or server.base_url).rstrip("/")
    current: ServerProcess | None = None

    async def gate(
        deadline_s: float, at: str | None = None, refused_limit_s: float | None = None
    ) -> ServerFacts:
        target = at or url
        async with SGLangClient(target, api_key=api_key, timeout_s=60.0) as client:
            waited = await wait_until_healthy(
                client,
                deadline_s=deadline_s,
                process=current,
                logger=logger,
                refused_limit_s=refused_limit_s,
            )
            logger.info(f"server at {target} healthy after {waited:.1f} s")
            return await preflight(
                client,
                server=server,
                model=config.model,
                sampling=config.sampling,
                retries=config.retries,
                logger=logger,
                api_key=api_key,
            )

    async def launch() -> ServerFacts:
        nonlocal current
        if current is not None:
            await current.astop()
        current = ServerProcess.for_spec(
            server, config.model, output_dir=config.output_dir, run_key=run_key, api_key=api_key
        )
        current.start()
        logger.info(f"launched server pid {current.pid}: {current.display_cmd}")
        logger.info(f"server log: {current.log_path}")
        return await gate(server.startup_timeout_s)

    if attach_url:
        urls = split_urls(attach_url)
        url = ",".join(urls)
        for one in urls:  # every server must pass the gate and the checks
            logger.info(f"attaching to the server at {one}")
            # An attached server already listens (or is down): refused is not "starting".
            facts = await gate(server.startup_timeout_s, one, ATTACH_REFUSED_S)
        relaunch = None
    else:
        reaped = reap_orphans(server_state_dir(config.output_dir))
        if reaped:
            logger.warning(f"stopped {len(reaped)} server(s) left behind by killed runs: {reaped}")
        relaunch = launch

    urls = split_urls(url)
    supervisor = ServerSupervisor(
        check=gate if len(urls) == 1 else partial(_gate_any, gate, urls),
        relaunch=relaunch,
        logger=logger,
        failure_threshold=server.lost_after_failures,
        max_relaunches=server.max_relaunches,
        check_deadline_s=server.recovery_check_s,
        name=f"server {url}" if len(urls) == 1 else f"every server of the pool ({', '.join(urls)})",
    )
    steered = [p.name for p in config.partitions if config.tier(p.tier).is_auto]
    # With auto tiers the controller keeps the server full, so the order requests start in
    # decides the makespan: longest first (sglang/budget.py).
    budget = ServerBudget(
        server.max_requests_in_flight,
        server.max_tokens_in_flight,
        adaptive=steered,
        longest_first=bool(steered),
    )
    controller = (
        ConcurrencyController(
            budget,
            LoadReader(urls, api_key=api_key),
            server.auto_concurrency,
            log=logger.info,
            warn=logger.warning,
            ceiling=server.max_requests_in_flight,
        )
        if auto
        else None
    )
    if controller is not None:
        logger.info(
            f"concurrency auto: starting at {controller.limit} in flight (server-wide, at most "
            f"{controller.maximum}), "
            f"reading the server's load every {server.auto_concurrency.interval_s:g} s"
        )
    try:
        if not attach_url:
            facts = await launch()
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
        if controller is not None:
            await controller.aclose()
        await supervisor.aclose()
        if current is not None:
            await current.astop()
