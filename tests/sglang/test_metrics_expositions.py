"""The load parser on real expositions: SGLang 0.5.23's own ``/metrics`` (its collectors in the
conformance harness, recorded by ``python -m conformance.metrics record`` with 4 requests in
flight and ``--max-running-requests 2``: 2 running, 2 queued), and sglang-router's (names,
types and labels from its ``metrics.rs``). The emulator's ``/metrics`` is held to the same
recording in ``tests/emulator/test_metrics_families.py``."""

from __future__ import annotations

import pytest

from eagle3_datagen.sglang.load import NotSGLangMetrics, metrics_kind, parse_metrics
from tests.support.exposition import ROUTER, SGLANG


def test_sglangs_own_exposition_is_read() -> None:
    sample = parse_metrics(SGLANG.read_text())
    assert (sample.running, sample.queued) == (2, 2)
    assert 0.0 <= sample.token_usage <= 1.0
    # No retraction yet: SGLang's counter has no series then; absent means 0, not unknown.
    assert "sglang:num_retracted_requests_total{" not in SGLANG.read_text()
    assert sample.retracted_total == 0
    assert metrics_kind(SGLANG.read_text()) == "SGLang's"


def test_a_routers_exposition_is_recognised_not_read() -> None:
    text = ROUTER.read_text()
    with pytest.raises(NotSGLangMetrics, match=r"a router's \(sglang-router: sgl_router_\*\)"):
        parse_metrics(text)


def test_a_page_that_is_not_prometheus_text_is_named_so() -> None:
    # A proxy's HTML where /metrics should be: one short reason, not a parse error's traceback.
    html = "<!doctype html><html><body>" + "x" * 500 + "</body></html>\n"
    with pytest.raises(NotSGLangMetrics, match=r"^not Prometheus text \(") as caught:
        parse_metrics(html)
    assert len(str(caught.value)) < 150
    assert metrics_kind(html) == str(caught.value)
