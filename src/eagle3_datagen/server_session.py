"""One context manager for "a usable server": launch or attach, health gate, pre-flight.

Launch mode starts the configured engine (SGLang, or the emulator with the same flags), reaps
servers orphaned by earlier killed runs, waits for health and stops the server on exit, whatever
the exit. Attach mode runs the same gate and checks and never stops a server it did not start.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

from eagle3_datagen.config import PipelineConfig
from eagle3_datagen.sglang.client import SGLangClient
from eagle3_datagen.sglang.health import LogSink, wait_until_healthy
from eagle3_datagen.sglang.launcher import ServerProcess, resolve_api_key, server_state_dir
from eagle3_datagen.sglang.orphans import reap_orphans
from eagle3_datagen.sglang.preflight import ServerFacts, preflight


@dataclass(slots=True)
class ServerSession:
    """A server that passed the gate: where it is and what it reported about itself."""

    url: str
    facts: ServerFacts
    launched: bool
    display_cmd: str | None
    log_path: str | None


@asynccontextmanager
async def open_server(
    config: PipelineConfig,
    *,
    run_key: str,
    logger: LogSink,
    server_url: str | None = None,
) -> AsyncIterator[ServerSession]:
    """Yield a healthy, checked server; a launched one is stopped when the block exits."""
    server = config.server
    api_key = resolve_api_key(server)
    attach_url = server_url or (server.url if server.mode == "attach" else None)
    if attach_url:
        url = attach_url.rstrip("/")
        logger.info(f"attaching to the server at {url}")
        async with SGLangClient(url, api_key=api_key, timeout_s=60.0) as client:
            await wait_until_healthy(client, deadline_s=server.startup_timeout_s, logger=logger)
            facts = await preflight(
                client, server=server, model=config.model, logger=logger, api_key=api_key
            )
        yield ServerSession(url, facts, launched=False, display_cmd=None, log_path=None)
        return

    reaped = reap_orphans(server_state_dir(config.output_dir))
    if reaped:
        logger.warning(f"stopped {len(reaped)} server(s) left behind by killed runs: {reaped}")
    process = ServerProcess.for_spec(
        server, config.model, output_dir=config.output_dir, run_key=run_key, api_key=api_key
    )
    async with process:
        logger.info(f"launched server pid {process.pid}: {process.display_cmd}")
        logger.info(f"server log: {process.log_path}")
        url = server.base_url
        async with SGLangClient(url, api_key=api_key, timeout_s=60.0) as client:
            waited = await wait_until_healthy(
                client, deadline_s=server.startup_timeout_s, process=process, logger=logger
            )
            logger.info(f"server healthy after {waited:.1f} s")
            facts = await preflight(
                client, server=server, model=config.model, logger=logger, api_key=api_key
            )
        yield ServerSession(
            url, facts, launched=True, display_cmd=process.display_cmd,
            log_path=str(Path(process.log_path)),
        )  # fmt: skip
