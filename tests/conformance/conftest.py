"""Tests against SGLang 0.5.23's real HTTP app (`conformance/`): run with conformance/run.sh.

Each module starts with `requires_sglang()`: skipped, with the reason, wherever sglang is not
importable (the default install and CI).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from conformance.process import RealAppProcess


@pytest.fixture
def real_app(tmp_path: Path) -> Iterator[Callable[..., RealAppProcess]]:
    """Starts real-app processes (not yet awaited) and stops them all at teardown."""
    started: list[RealAppProcess] = []

    def start(*flags: str, **kwargs: object) -> RealAppProcess:
        app = RealAppProcess(tmp_path, *flags, **kwargs)  # type: ignore[arg-type]
        started.append(app)
        return app

    yield start
    for app in started:
        app.stop()
