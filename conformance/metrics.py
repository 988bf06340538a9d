"""SGLang 0.5.23's own ``/metrics`` for the real app: its scheduler collector, fed by the fake
engine, and the recording of the exposition as a fixture.

In SGLang the scheduler process registers ``SchedulerMetricsCollector``
(``observability/metrics_collector.py``) with the labels ``Scheduler`` builds (``model_name``,
``engine_type``, ``tp_rank``, ``pp_rank``, ``moe_ep_rank``) and calls ``log_stats`` on every
stats interval; the HTTP process serves what all processes wrote to ``PROMETHEUS_MULTIPROC_DIR``
(``utils/common.py`` ``add_prometheus_middleware``). The harness has no scheduler process, so
:func:`install` makes the same collector in the HTTP process, after the same
``set_prometheus_multiproc_dir``, and logs the fake engine's state into it every 0.1 s (running
= the fake engine's requests in flight up to ``--max-running-requests``, queued = the rest,
token usage from the tokens they hold). The names, types and labels are SGLang's own; only the
values come from the fake engine.

    python -m conformance.metrics record   # writes tests/fixtures/sglang-0.5.23/metrics.txt

``record`` also writes the emulator's catalogue of SGLang's families
(``src/sglang_emulator/sglang_metrics.prom``: the recording with every value 0), which the
emulator renders with its own values; ``tests/emulator/test_metrics_families.py`` holds its
``/metrics`` to the recording.
"""

from __future__ import annotations

import re
import sys
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
FIXTURE = REPO / "tests/fixtures/sglang-0.5.23/metrics.txt"
CATALOGUE = REPO / "src/sglang_emulator/sglang_metrics.prom"


def prepare(argv: list[str]) -> None:
    """Before anything imports prometheus_client: SGLang's multiprocess directory, as its
    launcher sets it (``entrypoints/engine.py``) when metrics are on."""
    if "--enable-metrics" in argv:
        from sglang.srt.utils.common import set_prometheus_multiproc_dir

        set_prometheus_multiproc_dir()


def install(server_args: Any, tokenizer_manager: Any) -> None:
    """SGLang's collectors in this process: the tokenizer manager's own (its
    ``init_metric_collector_watchdog``, which the fake one skips at construction), and the
    scheduler's, logging the fake engine's state."""
    if not server_args.enable_metrics:
        return
    tokenizer_manager.init_metric_collector_watchdog()
    scheduler = tokenizer_manager.scheduler
    from sglang.srt.observability.metrics_collector import SchedulerMetricsCollector
    from sglang.srt.runtime_context import get_serving

    labels = {  # managers/scheduler.py, as Scheduler builds them on one rank
        "model_name": get_serving().served_model_name,
        "engine_type": "unified",
        "tp_rank": 0,
        "pp_rank": 0,
        "moe_ep_rank": 0,
    }
    collector = SchedulerMetricsCollector(labels=labels, server_args=server_args)
    thread = threading.Thread(
        target=_log_forever, args=(collector, scheduler, server_args), daemon=True
    )
    thread.start()


def _stats(scheduler: Any, server_args: Any) -> Any:
    from sglang.srt.observability.metrics_collector import QueueCount, SchedulerStats

    runs = list(scheduler.running.values())
    cap = server_args.max_running_requests or len(runs) or 1
    running, queued = runs[:cap], runs[cap:]
    used = sum(len(r.output_ids) for r in running)
    pool = scheduler.max_total_num_tokens
    return SchedulerStats(
        num_running_reqs=QueueCount(total=len(running)),
        num_queue_reqs=QueueCount(total=len(queued)),
        num_used_tokens=used,
        kv_used_tokens=used,
        kv_available_tokens=max(0, pool - used),
        token_usage=used / pool if pool else 0.0,
        full_token_usage=used / pool if pool else 0.0,
        gen_throughput=float(used),
    )


def _log_forever(collector: Any, scheduler: Any, server_args: Any) -> None:
    while True:
        try:
            collector.log_stats(_stats(scheduler, server_args))
        except Exception as err:  # never take the app down; say why once a second at most
            print(f"conformance.metrics: {err!r}", file=sys.stderr, flush=True)
            time.sleep(1.0)
        time.sleep(0.1)


def record(work: Path) -> str:
    """The real app's /metrics while requests are in flight, written to :data:`FIXTURE`."""
    text = exposition(work)
    FIXTURE.write_text(text)
    CATALOGUE.write_text(catalogue(text))
    return text


def catalogue(text: str) -> str:
    """The recorded exposition with every sample's value 0: SGLang's families (HELP, TYPE,
    label sets, histogram buckets) for the emulator to fill with its own values."""
    head = (
        "# SGLang 0.5.23's /metrics families, recorded from its own collectors by "
        "conformance/metrics.py (values zeroed; the emulator fills in its own)\n"
    )
    lines = [
        line if line.startswith("#") or not line else line.rpartition(" ")[0] + " 0.0"
        for line in text.splitlines()
    ]
    return head + "\n".join(lines) + "\n"


def exposition(work: Path) -> str:
    """The real app's /metrics with 4 requests in flight and ``--max-running-requests 2``."""
    import concurrent.futures

    import httpx

    from conformance.process import RealAppProcess

    with RealAppProcess(
        work,
        "--enable-metrics",
        "--max-running-requests",
        "2",
        "--fake-latency-s",
        "3",
        "--served-model-name",
        "moonshotai/Kimi-K2.5",
    ) as app:
        body = {"input_ids": [1, 2, 3, 4], "sampling_params": {"max_new_tokens": 600}}
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            futures = [
                pool.submit(httpx.post, f"{app.url}/generate", json=body, timeout=120)
                for _ in range(4)
            ]
            time.sleep(1.0)
            text = httpx.get(f"{app.url}/metrics", timeout=30).text
            for f in futures:
                f.result()
    return re.sub(r'pid="\d+"', 'pid="1"', text)  # the only volatile label value


if __name__ == "__main__":
    import tempfile

    if sys.argv[1:] != ["record"]:
        sys.exit("usage: python -m conformance.metrics record")
    out = record(Path(tempfile.mkdtemp(prefix="metrics-")))
    print(f"{FIXTURE}: {len(out.splitlines())} lines")
