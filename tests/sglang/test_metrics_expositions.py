"""The load parser on real expositions: SGLang 0.5.23's own ``/metrics`` (its collectors in the
conformance harness, recorded by ``python -m conformance.metrics record`` with 4 requests in
flight and ``--max-running-requests 2``: 2 running, 2 queued), and sglang-router's (names,
types and labels from its ``metrics.rs``); and the emulator's ``/metrics`` against SGLang's
(every family the emulator serves is SGLang's, with the same type and label names)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from eagle3_datagen.sglang.load import NotSGLangMetrics, metrics_kind, parse_metrics
from tests.support.emulator import EmulatorProcess

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
SGLANG = FIXTURES / "sglang-0.5.23" / "metrics.txt"
ROUTER = FIXTURES / "sglang-router" / "metrics.txt"
RETRACTION_COUNTERS = (
    "sglang:num_retracted_requests_total",
    "sglang:num_retracted_input_tokens_total",
    "sglang:num_retracted_output_tokens_total",
)


def families(text: str) -> dict[str, tuple[str, frozenset[str]]]:
    """Per metric family: its type and the label names of its samples (``le``, ``quantile``
    and multiprocess ``pid`` aside)."""
    types: dict[str, str] = {}
    labels: dict[str, set[str]] = {}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split()
            types[name] = kind
            labels.setdefault(name, set())
        elif line and not line.startswith("#"):
            sample, _, rest = line.partition("{")
            names = {p.split("=")[0] for p in rest.rpartition("}")[0].split('",') if "=" in p}
            family = next(
                (f for f in (sample, *(sample.removesuffix(s) for s in
                 ("_bucket", "_sum", "_count", "_total", "_created"))) if f in types),
                sample,
            )  # fmt: skip
            labels.setdefault(family, set()).update(names - {"le", "quantile", "pid"})
    return {n: (types.get(n, "untyped"), frozenset(labels.get(n, ()))) for n in types}


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


def test_the_emulators_metrics_are_sglangs_names_types_and_labels(
    emulator_factory: Callable[..., EmulatorProcess],
) -> None:
    emu = emulator_factory("--emu-physics", "seed-node", "--enable-metrics").wait_ready()
    served = families(httpx.get(f"{emu.url}/metrics", timeout=10).text)
    sglang = families(SGLANG.read_text())
    assert served, "the emulator serves no metric family"
    # SGLang registers its retraction counters (metrics_collector.py:557-571, the scheduler's
    # labels) but a series appears only at the first retraction, which the recording has none
    # of: the emulator serves them from the start, at 0.
    scheduler_labels = sglang["sglang:num_running_reqs"]
    for name in RETRACTION_COUNTERS:
        sglang.setdefault(name, ("counter", scheduler_labels[1]))
    differ = {
        name: (kind, sglang.get(name)) for name, kind in served.items() if sglang.get(name) != kind
    }
    assert not differ, f"emulator family -> (its type and labels, SGLang's): {differ}"
    # The series the controller reads are among them.
    for name in ("sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:token_usage",
                 "sglang:gen_throughput", "sglang:num_retracted_requests"):  # fmt: skip
        assert name in served or f"{name}_total" in served, name
