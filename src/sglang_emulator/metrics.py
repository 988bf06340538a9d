"""SGLang's load surfaces: ``GET /metrics`` (Prometheus text) and ``GET /v1/loads`` (JSON).

``/metrics`` serves every family SGLang 0.5.23 serves, with its names, types, HELP texts, label
names and histogram buckets: ``sglang_metrics.prom`` is SGLang's own exposition, recorded from
its collectors by ``conformance/metrics.py`` with the values zeroed, and this module fills it
with the emulator's values (held to the recording in CI, ``tests/emulator/
test_metrics_families.py``). What the emulator models has its value: the scheduler's running,
queue, KV and throughput gauges, the tokenizer manager's request and token counters and its
latency and length histograms, the HTTP request counters, idle and CPU seconds; everything else
(speculative decoding, DP attention, disaggregation, SWA/Mamba pools) stays 0 as on a server
without those features. The retraction counters (``metrics_collector.py:557-571``, the
scheduler's labels) appear at the first retraction, as SGLang's do (a counter's series exists
once ``labels(...).inc()`` ran). Served only with ``--enable-metrics``
(``entrypoints/http_server.py:314``).

``/v1/loads`` (``entrypoints/v1_loads.py:96``), always on, carries ``LoadSnapshot``'s core
fields (``managers/load_snapshot.py:196-226``). Without ``--emu-physics`` the values come from
the plain latency model's counters (running, queued), with no KV accounting.
"""

from __future__ import annotations

import bisect
import itertools
import os
import re
import time
from collections import Counter
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

CATALOGUE = Path(__file__).parent / "sglang_metrics.prom"
_RECORDED_MODEL = 'model_name="moonshotai/Kimi-K2.5"'
_SCHEDULER_LABELS = (
    'engine_type="unified",model_name="{model}",moe_ep_rank="0",pp_rank="0",tp_rank="0"'
)
_RETRACTION_COUNTERS = (
    ("num_retracted_requests", "retracted_requests_total", "Total number of retracted requests."),
    (
        "num_retracted_input_tokens",
        "retracted_input_tokens_total",
        "Total number of retracted input tokens.",
    ),
    (
        "num_retracted_output_tokens",
        "retracted_output_tokens_total",
        "Total number of retracted output tokens.",
    ),
)
_HTTP = ("sglang:http_requests_active", "sglang:http_requests_total", "sglang:http_responses_total")
_SAMPLE = re.compile(r"^(?P<name>[^{ ]+)(?P<labels>\{.*\})? (?P<value>\S+)$")


@dataclass(frozen=True)
class LoadView:
    """One reading of the server's load, whichever model produced it."""

    num_running_reqs: int
    num_queue_reqs: int
    num_used_tokens: int
    max_total_num_tokens: int
    max_running_requests: int
    gen_throughput: float
    new_token_ratio: float
    retracted_requests_total: int
    retracted_input_tokens_total: int
    retracted_output_tokens_total: int
    prompt_tokens_total: int
    generation_tokens_total: int
    requests_total: int
    idle_s: float = 0.0

    @property
    def token_usage(self) -> float:
        return self.num_used_tokens / self.max_total_num_tokens if self.max_total_num_tokens else 0


@dataclass(frozen=True)
class Family:
    """One family of the catalogue: its HELP and TYPE lines, and its samples as
    (sample name, label text) in SGLang's order."""

    name: str
    kind: str
    header: tuple[str, str]
    samples: tuple[tuple[str, str], ...]


def load_catalogue(path: Path = CATALOGUE) -> list[Family]:
    """SGLang's families as recorded (``sglang_metrics.prom``)."""
    families: list[Family] = []
    help_line = ""
    samples: list[tuple[str, str]] = []
    for line in path.read_text().splitlines():
        if line.startswith("# HELP "):
            help_line = line
        elif line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ", 3)
            samples = []
            families.append(Family(name, kind, (help_line, line), ()))
        elif line and not line.startswith("#"):
            m = _SAMPLE.match(line)
            if m is None:
                raise ValueError(f"{path}: not a sample line: {line!r}")
            samples.append((m["name"], m["labels"] or ""))
            last = families[-1]
            families[-1] = Family(last.name, last.kind, last.header, tuple(samples))
    return families


class Histogram:
    """Cumulative bucket counts over SGLang's bounds (read from the catalogue's ``le``)."""

    def __init__(self, bounds: list[float]) -> None:
        self.bounds = bounds
        self.counts = [0] * len(bounds)
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        i = bisect.bisect_left(self.bounds, value)
        if i < len(self.counts):
            self.counts[i] += 1
        self.sum += value
        self.count += 1


# Histograms the emulator observes, per finished request (the tokenizer manager's).
_OBSERVED = (
    "sglang:time_to_first_token_seconds",
    "sglang:e2e_request_latency_seconds",
    "sglang:prompt_tokens_histogram",
    "sglang:uncached_prompt_tokens_histogram",
    "sglang:generation_tokens_histogram",
)


def _le(labels: str) -> float:
    m = re.search(r'le="([^"]+)"', labels)
    if m is None:
        raise ValueError(f"histogram bucket without le: {labels}")
    return float(m[1])


class Observed:
    """What the emulator's HTTP side saw (per-request histograms, HTTP request counts), and the
    catalogue rendered once for the served model: the families whose values never move (the
    features the emulator does not model) are text made at start, the rest per reading."""

    def __init__(self, catalogue: list[Family], model_name: str) -> None:
        self.model_name = model_name
        self.histograms: dict[str, Histogram] = {}
        self.active: Counter[tuple[str, str]] = Counter()
        self.requests: Counter[tuple[str, str]] = Counter()
        self.responses: Counter[tuple[str, str, int]] = Counter()
        model = f'model_name="{model_name}"'
        pid = f'pid="{os.getpid()}"'
        self.parts: list[str | Family] = []
        for fam in catalogue:
            fam = Family(
                fam.name,
                fam.kind,
                fam.header,
                tuple(
                    (n, lab.replace(_RECORDED_MODEL, model).replace('pid="1"', pid))
                    for n, lab in fam.samples
                ),
            )
            if fam.name in _OBSERVED:
                bounds = sorted({_le(lab) for n, lab in fam.samples if n.endswith("_bucket")})
                self.histograms[fam.name] = Histogram(bounds)
            moves = fam.name in _OBSERVED or fam.name in _HTTP
            if moves or any(n in _MODELLED for n, _ in fam.samples):
                self.parts.append(fam)
            else:
                self.parts.append(
                    "\n".join([*fam.header, *(f"{n}{lab} 0.0" for n, lab in fam.samples)])
                )

    def finished(self, prompt: int, cached: int, output: int, latency_s: float) -> None:
        """One /generate answered (non-streaming: the first token reaches the client last)."""
        h = self.histograms
        for name, value in (
            ("sglang:time_to_first_token_seconds", latency_s),
            ("sglang:e2e_request_latency_seconds", latency_s),
            ("sglang:prompt_tokens_histogram", prompt),
            ("sglang:uncached_prompt_tokens_histogram", prompt - cached),
            ("sglang:generation_tokens_histogram", output),
        ):
            if name in h:
                h[name].observe(value)


def _fmt(v: float) -> str:
    return repr(float(v))


_MODELLED = frozenset(
    {
        "sglang:num_running_reqs",
        "sglang:num_queue_reqs",
        "sglang:gen_throughput",
        "sglang:token_usage",
        "sglang:full_token_usage",
        "sglang:num_used_tokens",
        "sglang:kv_used_tokens",
        "sglang:kv_available_tokens",
        "sglang:decode_sum_seq_lens",
        "sglang:new_token_ratio",
        "sglang:scheduler_idle_seconds_total",
        "sglang:process_cpu_seconds_total",
        "sglang:prompt_tokens_total",
        "sglang:generation_tokens_total",
        "sglang:num_requests_total",
    }
)


def _gauges(view: LoadView) -> dict[str, float]:
    """The scheduler's values the emulator models, by sample name."""
    used = view.num_used_tokens
    return {
        "sglang:num_running_reqs": view.num_running_reqs,
        "sglang:num_queue_reqs": view.num_queue_reqs,
        "sglang:gen_throughput": view.gen_throughput,
        "sglang:token_usage": view.token_usage,
        "sglang:full_token_usage": view.token_usage,
        "sglang:num_used_tokens": used,
        "sglang:kv_used_tokens": used,
        "sglang:kv_available_tokens": max(0, view.max_total_num_tokens - used),
        "sglang:decode_sum_seq_lens": used,
        "sglang:new_token_ratio": view.new_token_ratio,
        "sglang:scheduler_idle_seconds_total": view.idle_s,
        "sglang:process_cpu_seconds_total": time.process_time(),
        "sglang:prompt_tokens_total": view.prompt_tokens_total,
        "sglang:generation_tokens_total": view.generation_tokens_total,
        "sglang:num_requests_total": view.requests_total,
    }


def _http_samples(fam: Family, seen: Observed) -> list[str]:
    if fam.name == "sglang:http_responses_total":
        return [
            f'{fam.name}{{endpoint="{e}",method="{m}",status_code="{s}"}} {_fmt(n)}'
            for (e, m, s), n in seen.responses.items()
        ]
    counts = seen.active if fam.name == "sglang:http_requests_active" else seen.requests
    return [f'{fam.name}{{endpoint="{e}",method="{m}"}} {_fmt(n)}' for (e, m), n in counts.items()]


def _histogram_samples(fam: Family, h: Histogram) -> list[str]:
    """Buckets in the catalogue's order (ascending ``le``), then ``_sum`` and ``_count``."""
    running = itertools.accumulate(h.counts)
    out = []
    for name, labels in fam.samples:
        if name.endswith("_bucket"):
            value: float = next(running)
        else:
            value = h.sum if name.endswith("_sum") else h.count
        out.append(f"{name}{labels} {_fmt(value)}")
    return out


def prometheus_text(view: LoadView, seen: Observed) -> str:
    """The ``/metrics`` body: SGLang's families in SGLang's order, the emulator's values."""
    values = _gauges(view)
    lines: list[str] = []
    for part in seen.parts:
        if isinstance(part, str):
            lines.append(part)
            continue
        lines += part.header
        if part.name in _HTTP:
            lines += _http_samples(part, seen)
        elif part.name in seen.histograms:
            lines += _histogram_samples(part, seen.histograms[part.name])
        else:
            lines += [f"{n}{lab} {_fmt(values.get(n, 0.0))}" for n, lab in part.samples]
    if view.retracted_requests_total:  # SGLang's series exist from the first retraction on
        labels = "{" + _SCHEDULER_LABELS.format(model=seen.model_name) + "}"
        for name, attr, doc in _RETRACTION_COUNTERS:
            lines += [
                f"# HELP sglang:{name}_total {doc}",
                f"# TYPE sglang:{name}_total counter",
                f"sglang:{name}_total{labels} {_fmt(getattr(view, attr))}",
            ]
    return "\n".join(lines) + "\n"


def loads_json(view: LoadView, version: str) -> dict[str, Any]:
    """The ``/v1/loads`` body (``v1_loads.get_loads``), one DP rank."""
    load = {
        "timestamp": time.time(),
        "dp_rank": 0,
        "num_running_reqs": view.num_running_reqs,
        "num_waiting_reqs": view.num_queue_reqs,
        "num_used_tokens": view.num_used_tokens,
        "num_total_tokens": view.num_used_tokens,
        "max_total_num_tokens": view.max_total_num_tokens,
        "max_running_requests": view.max_running_requests,
        "token_usage": view.token_usage,
        "gen_throughput": view.gen_throughput,
        "cache_hit_rate": 0.0,
        "utilization": 0.0,
    }
    return {
        "timestamp": datetime.now(UTC).isoformat(),
        "version": version,
        "accelerator": None,
        "num_accelerators": 1,
        "loads": [load],
    }
