"""SGLang 0.5.23's real /metrics (its own collectors, fed by the fake engine) replays the
recorded exposition: the same families, types and label names (values differ run to run)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conformance import requires_sglang
from tests.support.exposition import SGLANG, families

requires_sglang()
pytestmark = pytest.mark.conformance


def test_the_real_apps_metrics_replay_the_recorded_exposition(tmp_path: Path) -> None:
    from conformance.metrics import exposition

    live = families(exposition(tmp_path))
    recorded = families(SGLANG.read_text())
    assert live == recorded, {
        n: (live.get(n), recorded.get(n))
        for n in live.keys() | recorded.keys()
        if live.get(n) != recorded.get(n)
    }
