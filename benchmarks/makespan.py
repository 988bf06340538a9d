"""(f) makespan of three partitions through the real Prefect flow against the server's peak
capacity, and (g) the flow process's CPU per record in that same run.

One emulator with ``--emu-physics seed-node`` (``sglang_emulator/physics.py``), time-scaled so a
run of ~1 simulated hour takes ~2 minutes; ``--emu-output-by-max-new`` gives each tier its own
lognormal output length (the tiers differ in ``max_tokens``), and prompts are lognormal in
length too. ``eagle3_datagen_flows.pipeline.datagen`` runs in a child process (the flow
process) on Prefect's embedded backend (``prefect_test_harness``), attached to the emulator:
three partitions, SHORT (150 in flight), MEDIUM (64) and LONG (32), side by side as a run does
them; then the same with every tier on ``concurrency: auto``.

Makespan: from the first batch request the server sees (the one after the pre-flight's smoke
request) to its last response (sampled from the emulator's counters every 50 ms), in simulated
seconds (wall / time scale), so Prefect's start-up, the pre-flight, the planning and the final
manifest are left out: on a GPU node they are seconds against hours, while the time scale would
stretch each real second of them to 33 simulated ones (``startup_s`` reports them, in real
seconds). Inside the makespan the emulator's own clock accounting splits the time the server did
no simulated work into ``client_gap_s`` (nothing queued or running: the client held work it had
not sent) and ``emulator_lag_lost_s`` (the emulator fell behind its scaled clock on the shared
cores); ``client_gaps`` lists the largest gaps and when they happened.

Lower bound, from the profile's arithmetic and the run's own records (prompt and output lengths
read back from Parquet):

    decode >= sum over output tokens of (per_req_ms + per_kv_token_us x its context)
              + base_ms x max(tokens / max_running_requests, contexts / KV pool)
    prefill >= prompt tokens / prefill rate + one step overhead per 8,192-token chunk

(a step's base cost is shared by at most the requests whose KV fits in the pool at once). The
bound has no tail: the last long outputs decode with the server nearly empty on any schedule, so
a short run cannot reach it; the report says how long the server ran below a quarter of its
median batch. CPU per record: the child's own ``getrusage`` over the flow call (imports, the
Prefect harness and the emulator are other processes or outside the clock) / records written.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import math
import os
import random
import resource
import shutil
import statistics
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self

from benchmarks.common import Emulator, cpu_s, emit, make_config, prompt_line, run_child

PROFILE = "seed-node"
# The emulator's --random-seed: an output's length is drawn from (prompt ids, seed), and SGLang
# (so the emulator) draws the seed per launch when none is given. Fixed, every run has the same
# workload, like the prompts; unfixed, the quick run's drain alone moved (f) by 0.14x.
EMULATOR_SEED = 0
OUTPUT_SIGMA = 0.8
PROMPT_SIGMA = 0.6


@dataclass(frozen=True)
class TierLoad:
    """One partition of the workload: its tier and its length distributions."""

    name: str
    concurrency: int
    max_tokens: int
    prompts: int
    mean_words: int  # prompt length, lognormal (~1.3 tokens per word with the bundled tokenizer)
    mean_output: int  # output length, lognormal (the emulator's --emu-output-by-max-new)


WORKLOAD = (
    TierLoad("SHORT", 150, 2048, 2400, 120, 300),
    TierLoad("MEDIUM", 64, 4096, 1200, 300, 1000),
    TierLoad("LONG", 32, 16384, 600, 600, 3000),
)
TIME_SCALE = 0.03


def write_inputs(root: Path, scale: float) -> list[tuple[TierLoad, Path]]:
    """One JSONL partition per tier, prompts of lognormal length (seeded: same every run)."""
    out = []
    first = 0
    for t in WORKLOAD:
        rng = random.Random(t.name)
        n = max(20, round(t.prompts * scale))
        mu = math.log(t.mean_words) - PROMPT_SIGMA**2 / 2
        path = root / f"{t.name.lower()}.jsonl"
        with path.open("w") as fh:
            for i in range(first, first + n):
                words = max(5, min(4000, round(rng.lognormvariate(mu, PROMPT_SIGMA))))
                fh.write(prompt_line(i, words) + "\n")
        out.append((t, path))
        first += n
    return out


def _config(inputs: list[tuple[TierLoad, Path]], out: Path, policy: str) -> Any:
    tiers = [
        (t.name, t.concurrency if policy == "static" else "auto", t.max_tokens) for t, _ in inputs
    ]
    return make_config(
        [(t.name.lower(), p, t.name) for t, p in inputs], out, tiers=tiers, batch_size=256
    )


def child(url: str, inputs_dir: Path, out: Path, policy: str, scale: float) -> dict[str, Any]:
    """The flow process: one ``datagen`` run; its CPU and records (run by ``run_child``)."""
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
    import pyarrow.parquet as pq
    from prefect.testing.utilities import prefect_test_harness

    from eagle3_datagen_flows.pipeline import datagen

    inputs = [(t, inputs_dir / f"{t.name.lower()}.jsonl") for t in WORKLOAD]
    config = _config(inputs, out, policy)
    # What the flow imports lazily (transformers with the tokenizer, pyarrow.compute and the
    # pandas it pulls in for the duplicate scan), imported before the clock like the flow's
    # own modules above: a once-per-process cost that a run of hours does not feel, and one
    # this machine inflates (PYTHONDONTWRITEBYTECODE=1: every import compiles from source).
    c_imp = cpu_s()
    # Likewise what the first flow and task run import (Prefect's engines and the asyncio
    # backend of anyio) and the shard reader of the run's summary (pyarrow.dataset).
    import anyio._backends._asyncio  # noqa: F401
    import pandas  # noqa: F401  (pyarrow imports it lazily when the duplicate scan sorts)
    import prefect.flow_engine
    import prefect.task_engine
    import prefect.utilities.visualization  # noqa: F401
    import pyarrow.compute
    import pyarrow.dataset  # noqa: F401

    from eagle3_datagen.generate.plan import load_tokenizer

    load_tokenizer(config)
    import_cpu = cpu_s() - c_imp
    with prefect_test_harness(server_startup_timeout=180):
        r0, c0, t0 = resource.getrusage(resource.RUSAGE_SELF), cpu_s(), time.monotonic()
        asyncio.run(datagen(config=config, server_url=url))
        cpu, wall = cpu_s() - c0, time.monotonic() - t0
        r1 = resource.getrusage(resource.RUSAGE_SELF)
    lengths: list[tuple[int, int]] = []
    for t, _ in inputs:
        files = sorted((out / t.name.lower()).glob("part-*.parquet"))
        table = pq.read_table(files, columns=["prompt_tokens", "completion_tokens"])
        lengths += zip(
            table["prompt_tokens"].to_pylist(), table["completion_tokens"].to_pylist(), strict=True
        )
    return {
        "cpu_s": cpu,
        "wall_s": wall,
        "records": len(lengths),
        "lengths": lengths,
        "import_cpu_s": import_cpu,
        "sys_cpu_s": r1.ru_stime - r0.ru_stime,
    }


def lower_bound_s(lengths: list[tuple[int, int]]) -> dict[str, float]:
    """The profile's least possible server time for these (prompt, output) lengths."""
    from sglang_emulator.physics import PROFILES

    p = PROFILES[PROFILE]
    tokens = sum(o for _, o in lengths)
    contexts = sum(o * n_in + o * (o - 1) / 2 for n_in, o in lengths)  # KV read per token
    per_token_ms = p.per_req_ms * tokens + p.per_kv_token_us * contexts / 1e3
    steps = max(tokens / p.max_running_requests, contexts / p.max_total_num_tokens)
    decode_s = (per_token_ms + p.base_ms * steps) / 1e3
    prompt = sum(n for n, _ in lengths)
    prefill_s = (
        prompt / p.prefill_tokens_per_s
        + p.prefill_overhead_ms * math.ceil(prompt / p.chunked_prefill_size) / 1e3
    )
    return {
        "decode_s": decode_s,
        "prefill_s": prefill_s,
        "bound_s": decode_s + prefill_s,
        "peak_tok_s": tokens / decode_s,
        "output_tokens": tokens,
        "prompt_tokens": prompt,
    }


class Sampler:
    """Polls the emulator's counters in a thread: when the server first and last held work.

    The run's first request is the pre-flight's smoke request; the clock starts at the second
    (the first of a batch), so the seconds the flow spends between them (partition subflows
    starting, planning, the first render) are ``startup_s`` and not part of the makespan.
    """

    def __init__(self, emu: Any, every_s: float = 0.05) -> None:
        self.emu, self.every_s = emu, every_s
        self.samples: list[tuple[float, int, float, float]] = []  # wall, running, sim_s, idle_s
        self.smoke: float | None = None  # when the pre-flight's smoke request arrived
        self.first: float | None = None
        self.last: float | None = None
        self.idle_at_first: float | None = None  # the next sample's: idle is counted at its end
        self.at_first: dict[str, Any] = {}  # the emulator's physics counters at first / last
        self.at_last: dict[str, Any] = {}
        self._base = emu.stats()["requests"]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.is_set():
            s = self.emu.stats()
            now = time.monotonic()
            busy = s["running"] + s["queued"] > 0
            if self.smoke is None and s["requests"] > self._base:
                self.smoke = now
            if self.first is not None and self.idle_at_first is None:
                self.idle_at_first = s["physics"]["idle_s"]
            if self.first is None and s["requests"] > self._base + 1:
                self.first, self.at_first = now, s["physics"]
            if busy:
                self.last, self.at_last = now, s["physics"]
            if self.first is not None:
                p = s["physics"]
                self.samples.append((now, s["running"], p["sim_s"], p["idle_s"]))
            self._stop.wait(self.every_s)


def _gaps(sampler: Sampler, top: int = 8) -> list[tuple[float, float]]:
    """The largest idle stretches as (when, how long), simulated seconds from the first
    request: idle the emulator counted between two samples (it is counted when it ends)."""
    t0 = sampler.samples[0][0]
    gaps = [
        ((b[0] - t0) / TIME_SCALE, (b[3] - a[3]) / TIME_SCALE)
        for a, b in itertools.pairwise(sampler.samples)
        if b[3] > a[3] and (sampler.first or 0) < a[0] and b[0] <= (sampler.last or b[0])
    ]
    return sorted(gaps, key=lambda g: -g[1])[:top]


def one_run(emu: Any, inputs_dir: Path, out: Path, policy: str, scale: float) -> dict[str, Any]:
    s0 = emu.stats()
    with Sampler(emu) as sampler:
        flow = run_child(
            "makespan", ["--child", emu.url, str(inputs_dir), str(out), policy, str(scale)]
        )
    s1 = emu.stats()
    assert sampler.first is not None and sampler.last is not None, "the server saw no request"
    makespan_s = (sampler.last - sampler.first) / TIME_SCALE
    bound = lower_bound_s([(n_in, n_out) for n_in, n_out in flow["lengths"]])
    running = [r for _, r, _, _ in sampler.samples if r > 0]
    median = statistics.median(running) if running else 0
    tail = [
        b[0] - a[0]
        for a, b in zip(sampler.samples, sampler.samples[1:], strict=False)
        if 0 < a[1] < median / 4
    ]
    sim = s1["physics"]["sim_s"] - s0["physics"]["sim_s"]
    first, last = sampler.at_first, sampler.at_last
    # Wall time of the makespan = simulated work x scale + idle + lag lost (the emulator's
    # clock accounting). Idle inside the window is the client's gap: the server had nothing
    # queued or running, yet more requests came later, so the client held work not yet sent.
    assert sampler.smoke is not None and sampler.idle_at_first is not None
    idle_s = (last["idle_s"] - sampler.idle_at_first) / TIME_SCALE
    lag_lost_s = (s1["physics"]["lag_lost_s"] - first["lag_lost_s"]) / TIME_SCALE
    return {
        "policy": policy,
        "records": flow["records"],
        "makespan_s": makespan_s,
        "server_busy_s": sim,
        **bound,
        "makespan_vs_bound": makespan_s / bound["bound_s"],
        "median_running": median,
        "tail_s": sum(tail) / TIME_SCALE,
        "retracted": s1["physics"]["retracted"] - s0["physics"]["retracted"],
        "emulator_lag_s": s1["physics"]["lag_s"],
        "startup_s": sampler.first - sampler.smoke,  # wall seconds, smoke to first batch request
        "client_gap_s": idle_s,
        "emulator_lag_lost_s": lag_lost_s,
        "unaccounted_s": makespan_s - (last["sim_s"] - first["sim_s"]) - idle_s - lag_lost_s,
        "client_gaps": _gaps(sampler),
        "flow_wall_s": flow["wall_s"],
        "flow_cpu_s": flow["cpu_s"],
        "cpu_ms_per_record": 1e3 * flow["cpu_s"] / max(1, flow["records"]),
        "flow_import_cpu_s": flow["import_cpu_s"],
        "flow_sys_cpu_s": flow["sys_cpu_s"],  # the kernel's share of flow_cpu_s
        "server_output_tokens": s1["output_tokens"] - s0["output_tokens"],
    }


def measure(scale: float = 1.0, policies: tuple[str, ...] = ("static", "auto")) -> dict[str, Any]:
    """(f) and (g) for each policy, one emulator for all (what ``run_all`` reports)."""
    means = ",".join(f"{t.max_tokens}:{t.mean_output}" for t in WORKLOAD)
    flags = [
        "--emu-physics",
        PROFILE,
        "--emu-time-scale",
        str(TIME_SCALE),
        "--enable-metrics",
        "--emu-output-by-max-new",
        means,
        "--emu-output-sigma",
        str(OUTPUT_SIGMA),
        "--random-seed",
        str(EMULATOR_SEED),
    ]
    root = Path(tempfile.mkdtemp(prefix="e3-makespan-"))
    try:
        write_inputs(root, scale)
        runs = []
        with Emulator(*flags) as emu:
            for policy in policies:
                runs.append(one_run(emu, root, root / f"out-{policy}", policy, scale))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return {
        "profile": PROFILE,
        "time_scale": TIME_SCALE,
        "tiers": [t.__dict__ for t in WORKLOAD],
        "scale": scale,
        "runs": runs,
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--scale", type=float, default=1.0, help="multiply the prompt counts")
    ap.add_argument("--policies", default="static,auto")
    ap.add_argument("--child", nargs=5, metavar=("URL", "INPUTS", "OUT", "POLICY", "SCALE"))
    args = ap.parse_args(argv)
    if args.child:
        url, inputs, out, policy, scale = args.child
        emit(child(url, Path(inputs), Path(out), policy, float(scale)))
        return
    result = measure(args.scale, tuple(args.policies.split(",")))
    emit(result)


if __name__ == "__main__":
    main()
