"""Several SGLang servers behind one partition, spread by fewest requests in flight.

Why not round-robin: generations differ in length by 100x, so equal counts are unequal loads;
the server with the fewest requests in flight is the one with free slots. A server that fails
``down_after`` connections in a row is set aside and probed again after ``probe_after_s``; its
in-flight requests fail with connection errors and the runner's retries land on the others.

SGLang's own router (``python -m sglang_router.launch_router --worker-urls ...``) is the
alternative for many servers: attach to the router's URL like to a single server.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass

from eagle3_datagen.errors import RetryableRequestError
from eagle3_datagen.sglang.client import (
    ClosedOnExit,
    GenerateRequest,
    GenerateResult,
    SGLangClient,
)


@dataclass(slots=True)
class _Member:
    client: SGLangClient
    in_flight: int = 0
    failures: int = 0
    down_until: float = 0.0


class ServerPool(ClosedOnExit):
    """Same ``generate`` as :class:`SGLangClient`, over several servers."""

    def __init__(
        self,
        urls: list[str],
        *,
        api_key: str | None = None,
        timeout_s: float = 1800.0,
        max_connections: int = 256,
        down_after: int = 3,
        probe_after_s: float = 15.0,
    ) -> None:
        if not urls:
            raise ValueError("ServerPool needs at least one URL")
        self.members = [
            _Member(
                SGLangClient(
                    u, api_key=api_key, timeout_s=timeout_s, max_connections=max_connections
                )
            )
            for u in urls
        ]
        self.down_after = down_after
        self.probe_after_s = probe_after_s
        self._tiebreak = itertools.count()

    @property
    def base_url(self) -> str:
        return ",".join(m.client.base_url for m in self.members)

    def _pick(self) -> _Member:
        now = time.monotonic()
        live = [m for m in self.members if m.down_until <= now]
        if not live:
            raise RetryableRequestError(
                f"all {len(self.members)} servers are down: {self.base_url}"
            )
        start = next(self._tiebreak) % len(live)
        rotated = live[start:] + live[:start]  # equal loads rotate instead of piling on one
        return min(rotated, key=lambda m: m.in_flight)

    async def generate(self, request: GenerateRequest) -> GenerateResult:
        member = self._pick()
        member.in_flight += 1
        try:
            result = await member.client.generate(request)
        except RetryableRequestError as err:
            if err.status is None:
                member.failures += 1
                if member.failures >= self.down_after:
                    member.down_until = time.monotonic() + self.probe_after_s
            raise
        finally:
            member.in_flight -= 1
        member.failures = 0
        return result

    async def aclose(self) -> None:
        for m in self.members:
            await m.client.aclose()


def split_urls(urls: str) -> list[str]:
    """``"http://a:8000, http://b:8000"`` -> both URLs, without trailing slashes."""
    return [u.strip().rstrip("/") for u in urls.split(",") if u.strip()]


def connect(
    urls: str, *, api_key: str | None, timeout_s: float, max_connections: int
) -> SGLangClient | ServerPool:
    """A client for one server URL, or a pool for a comma-separated list of them."""
    parts = split_urls(urls)
    if len(parts) == 1:
        return SGLangClient(
            parts[0], api_key=api_key, timeout_s=timeout_s, max_connections=max_connections
        )
    return ServerPool(parts, api_key=api_key, timeout_s=timeout_s, max_connections=max_connections)
