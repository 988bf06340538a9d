"""SGLang's load surfaces: ``GET /metrics`` (Prometheus text) and ``GET /v1/loads`` (JSON).

Names, labels and semantics follow SGLang 0.5.23: the scheduler gauges and counters of
``observability/metrics_collector.py`` (``SchedulerMetricsCollector``, lines 365-721; labels
``model_name``, ``engine_type``, ``tp_rank``, ``pp_rank``, ``moe_ep_rank`` at lines 1382-1388),
served at ``/metrics`` only when the server runs with ``--enable-metrics``
(``entrypoints/http_server.py:314``); and ``/v1/loads`` (``entrypoints/v1_loads.py:96``), always
on, whose ``loads`` entries carry ``LoadSnapshot``'s core fields
(``managers/load_snapshot.py:196-226``). Without ``--emu-physics`` the values come from the
plain latency model's counters (running, queued), with no KV accounting.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any


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

    @property
    def token_usage(self) -> float:
        return self.num_used_tokens / self.max_total_num_tokens if self.max_total_num_tokens else 0


_GAUGES = (
    ("num_running_reqs", "The number of running requests."),
    ("num_queue_reqs", "The number of requests in the waiting queue."),
    ("gen_throughput", "The generation throughput (token/s)."),
    ("token_usage", "The token usage."),
    ("num_used_tokens", "The number of used tokens."),
    ("new_token_ratio", "The new token ratio."),
)
_COUNTERS = (
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
    ("prompt_tokens", "prompt_tokens_total", "Number of prefill tokens processed."),
    ("generation_tokens", "generation_tokens_total", "Number of generation tokens processed."),
    ("num_requests", "requests_total", "Number of requests processed."),
)


_TOKENIZER_SIDE = frozenset({"prompt_tokens", "generation_tokens", "num_requests"})


def _fmt(v: float) -> str:
    return repr(float(v))


def prometheus_text(view: LoadView, model_name: str) -> str:
    """The ``/metrics`` body: one ``# HELP``/``# TYPE`` block per metric, SGLang's names."""
    labels = (
        f'{{engine_type="unified",model_name="{model_name}",moe_ep_rank="0",pp_rank="0",'
        'tp_rank="0"}'
    )
    lines: list[str] = []
    for name, doc in _GAUGES:
        value = view.token_usage if name == "token_usage" else getattr(view, name)
        lines += [
            f"# HELP sglang:{name} {doc}",
            f"# TYPE sglang:{name} gauge",
            f"sglang:{name}{labels} {_fmt(value)}",
        ]
    # The tokenizer manager's counters carry its own labels (TokenizerMetricsCollector), not
    # the scheduler's: as recorded from SGLang's collectors (tests/fixtures/.../metrics.txt).
    request_labels = f'{{engine_type="unified",is_streaming="false",model_name="{model_name}"}}'
    for name, attr, doc in _COUNTERS:
        where = request_labels if name in _TOKENIZER_SIDE else labels
        lines += [
            f"# HELP sglang:{name}_total {doc}",
            f"# TYPE sglang:{name}_total counter",
            f"sglang:{name}_total{where} {_fmt(getattr(view, attr))}",
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
