"""Fixtures for server-lifecycle tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.servers import Cleanup


@pytest.fixture
def cleanup() -> Iterator[Cleanup]:
    c = Cleanup()
    try:
        yield c
    finally:
        c.run()
