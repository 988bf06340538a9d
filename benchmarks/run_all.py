"""The pipeline's performance against its targets, in one run, against the bundled emulator.

    uv run python benchmarks/run_all.py            # full sizes, ~10 minutes on 2 cores
    uv run python benchmarks/run_all.py --quick    # smaller sizes, ~2 minutes; indicative only

Prints each figure next to its target with PASS or MISS (and why), plus the details behind it.
Everything is a ratio or a per-record cost measured within the same run: the machines are
shared and noisy, so absolute rates mean little. A full run prepends its figures to
``benchmarks/RESULTS.md`` (newest first, the latest 10 kept; ``--results PATH`` writes another
file, also for a quick run; ``--no-results`` writes none). ``--json PATH`` writes every number;
``--markdown`` prints the figures table.

Parts (each module's docstring says exactly what it measures):
  (a) client_overhead: pipeline vs the seed's bare loop, zero-latency emulator
  (b) utilization:     slot utilization, partitions side by side vs one after another
  (c) memory:          peak RSS with 10k and 1M prompts in one partition; input scan rate
  (d) tokenize_rate:   ChatTokenizer.render vs per-prompt apply_chat_template
  (e) adaptive:        concurrency auto vs a sweep of static values, per emulator physics profile
  (f) makespan:        three partitions through the Prefect flow vs the server's peak capacity
  (g) makespan:        the flow process's CPU per record in that run
  (h) logprob_cost:    bytes and client CPU per record with logprobs top_k 0, 1, 20 vs off
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import (
    adaptive,
    client_overhead,
    logprob_cost,
    makespan,
    memory,
    readme_summary,
    results_md,
    tokenize_rate,
    utilization,
)


@dataclass
class Figure:
    """One measured figure, its target and verdict."""

    part: str
    name: str
    value: str
    target: str
    ok: bool
    why: str = ""

    @property
    def verdict(self) -> str:
        return "PASS" if self.ok else "MISS"


# The figures ``--gate`` fails on: the ratios, which compare across machines ((b), (c), (d),
# (e), (f)); the CPU figures ((a), (g)) and (h)'s prices are reported, not gated, since CI's
# machine is shared. CI runs the quick sizes, on which some targets cannot be met by design
# (a short run's final drain is a large share of it: (b) and (f)), and a shared 2-core machine
# moves (e) by up to 0.15x (benchmarks/RESULTS.md). So the gate holds each ratio to a *slip
# limit*: beyond the noise seen on such machines, short of the target. A real regression (the
# /metrics parse that cost auto a fifth of a core, memory growing with the input) lands far
# past it. The targets themselves are judged by full runs, in RESULTS.md.
GATED = "bcdef"
# (f) static's drain has missed 1.05x in every run: quick, 1.17-1.31x while the emulator drew
# its output lengths per launch, 1.19-1.22x on the fixed workload (makespan.EMULATOR_SEED).
GATE_F_STATIC = 1.3
# (d) by wall clock counts the Rust encoder's second thread, which a loaded machine does not
# have (1.86x quiet, 1.58x at load 1.8 on the same machine); per CPU second it held (1.42x,
# 1.39x), and a per-prompt encode would be about 1x. The gate holds the CPU ratio.
GATE_D_CPU = 1.2
# Printed, not gated: their gated twin is steadier on a shared machine.
REPORTED = ("prompts tokenized/s",)
# name prefix -> (comparison, slip limit); (b)'s slots are held to "above sequential" instead.
SLIP_LIMITS: dict[str, tuple[str, float]] = {
    "peak RSS": ("<=", 1.15),
    "auto / best static": (">=", 0.85),
    "makespan / peak-capacity bound": ("<=", GATE_F_STATIC),
}


def _leading_number(value: str) -> float:
    """The figure's first number: ``1.07x (303 / 283 MB)`` -> 1.07, ``89.6% (...)`` -> 0.896."""
    head = value.split(" ", 1)[0].rstrip("x")
    return float(head[:-1]) / 100 if head.endswith("%") else float(head)


def gate_failures(figs: list[Figure]) -> list[tuple[Figure, str]]:
    """The gated figures that miss their slip limit, each with that limit."""
    out = []
    for f in figs:
        if f.part not in GATED or f.name.startswith(REPORTED):
            continue
        if f.name.startswith("slot utilization"):
            pipeline, sequential = f.value.split("(sequential ", 1)
            if _leading_number(pipeline) <= _leading_number(sequential.rstrip(")")):
                out.append((f, "> sequential"))
            continue
        limit = next((v for k, v in SLIP_LIMITS.items() if f.name.startswith(k)), None)
        if limit is None:  # no slip limit: held to its own target
            if not f.ok:
                out.append((f, f.target))
            continue
        op, bound = limit
        x = _leading_number(f.value)
        if (op == "<=" and x > bound) or (op == ">=" and x < bound):
            out.append((f, f"{op} {bound:g}x"))
    return out


def machine() -> dict[str, Any]:
    """Where the numbers come from: cores, CPU model, load, date."""
    model = platform.processor() or "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "host": platform.node(),
        "nproc": os.cpu_count(),
        "cpu": model,
        "python": platform.python_version(),
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "loadavg_start": os.getloadavg(),
    }


def sizes(quick: bool, scale: float) -> dict[str, Any]:
    def n(x: float) -> int:
        return max(1, round(x * scale))

    if quick:
        return {
            "a_prompts": n(3000),
            "a_repeats": 1,
            "a_flow_prompts": n(1280),
            "b": utilization.Scenario(
                decode_ms=0.5, prompts=(n(1500), n(1000), n(500)), budget_prompts=(n(1500), n(500))
            ),
            "c_small": n(10_000),
            "c_big": n(200_000),
            "d_prompts": n(500),
            "e_scale": scale,
            "f_scale": max(0.02, 0.25 * scale),
            "h_prompts": n(200),
        }
    return {
        "a_prompts": n(10_000),
        "a_repeats": 3,
        "a_flow_prompts": n(2560),
        "b": utilization.Scenario(
            prompts=(n(4500), n(3000), n(1500)), budget_prompts=(n(6000), n(2000))
        ),
        "c_small": n(10_000),
        "c_big": n(1_000_000),
        "d_prompts": n(2000),
        "e_scale": scale,
        "f_scale": scale,
        "h_prompts": n(400),
    }


def figures(r: dict[str, Any]) -> list[Figure]:
    """The performance targets (docs/performance.md), each with its verdict and, for a miss,
    the reason."""
    out: list[Figure] = []
    if a := r.get("a"):
        out += client_figures(a)
    if b := r.get("b"):
        out += utilization_figures(b)
    if c := r.get("c"):
        out.append(memory_figure(c))
    if d := r.get("d"):
        out += tokenize_figures(d)
    if e := r.get("e"):
        out += adaptive_figures(e)
    if f := r.get("f"):
        out += makespan_figures(f)
    if h := r.get("h"):
        out += logprob_cost.figures(h, Figure)
    return out


def client_figures(a: dict[str, Any]) -> list[Figure]:
    """(a) throughput against the bare loop and client CPU per record."""
    ratio = a["throughput_ratio"]
    cpu, render, bare = a["pipeline_cpu_ms"], a["render_cpu_ms"], a["bare_cpu_ms"]
    return [
        Figure(
            "a",
            "throughput, pipeline / bare loop",
            f"{ratio:.2f}x",
            ">= 0.9x",
            ratio >= 0.9,
            ""
            if ratio >= 0.9
            else f"the pipeline is bound by its client CPU: "
            f"{cpu:.2f} ms per record against the bare loop's {bare:.2f}, the "
            f"difference being the chat-template render ({render:.2f} ms) that the "
            "bare loop did before its clock started",
        ),
        Figure(
            "a",
            "client CPU per record, pipeline",
            f"{cpu:.2f} ms",
            "<= 0.5 ms",
            cpu <= 0.5,
            ""
            if cpu <= 0.5
            else f"rendering the chat template and tokenizing "
            f"alone costs {render:.2f} ms per prompt (the bare loop does it before "
            f"its clock starts); everything else {cpu - render:.2f} ms",
        ),
    ]


def utilization_figures(b: dict[str, Any]) -> list[Figure]:
    """(b) slot utilization side by side, and the token budget's peak against its cap."""
    pu, su = b["pipeline_utilization"], b["sequential_utilization"]
    ok = pu >= 0.97 and pu > su
    why = ""
    if not ok:
        why = (
            f"below the sequential baseline ({su:.1%})"
            if pu <= su
            else "the final drain (the last long generations run with slots idle) is a "
            "large share of a short run"
        )
    value = f"{pu:.1%} (sequential {su:.1%})"
    slots = Figure(
        "b",
        "slot utilization, partitions side by side",
        value,
        ">= 97%, > sequential",
        ok,
        why,
    )
    peak, cap = b["budget_peak_tokens"], b["budget_cap_tokens"]
    value = (
        f"{peak:,} / {cap:,} (util {b['budget_utilization']:.1%}, "
        f"{b['unbudgeted_utilization']:.1%} uncapped)"
    )
    budget = Figure(
        "b",
        "token budget: peak KV tokens reserved / cap",
        value,
        "peak <= cap",
        peak <= cap,
        "" if peak <= cap else "the budget was exceeded",
    )
    return [slots, budget]


def memory_figure(c: dict[str, Any]) -> Figure:
    """(c) peak RSS of the big input against the small one."""
    ratio = c["peak_ratio"]
    scan = ""
    if "big_near_scan_s" in c:  # the input scan's rate, near-duplicate search included
        rate = c["big_prompts"] / c["big_near_scan_s"]
        scan = f"; input scan {rate:,.0f} lines/s with near duplicates"
    return Figure(
        "c",
        f"peak RSS, {c['big_prompts']:,} / {c['small_prompts']:,} prompts",
        f"{ratio:.2f}x ({c['big_peak_mb']:.0f} / {c['small_peak_mb']:.0f} MB){scan}",
        "<= 1.15x",
        ratio <= 1.15,
        "" if ratio <= 1.15 else "memory grows with the input",
    )


def tokenize_figures(d: dict[str, Any]) -> list[Figure]:
    """(d) prompts tokenized per second, batched render against the naive loop: by wall clock
    (the target), and per CPU second (what the gate holds)."""
    sp, cpu = d["speedup"], d["cpu_speedup"]
    return [
        Figure(
            "d",
            "prompts tokenized/s, render / naive loop",
            f"{sp:.2f}x ({d['batched_rate']:,.0f} vs {d['naive_rate']:,.0f}/s)",
            ">= 2x",
            sp >= 2.0,
            ""
            if sp >= 2
            else "the chat template (Jinja, per prompt) dominates "
            "both sides; batching only speeds up the encoding",
        ),
        Figure(
            "d",
            "prompts tokenized per CPU second, render / naive loop",
            f"{cpu:.2f}x ({d['batched_cpu_rate']:,.0f} vs {d['naive_cpu_rate']:,.0f}/s)",
            f">= {GATE_D_CPU:g}x",
            cpu >= GATE_D_CPU,
            "" if cpu >= GATE_D_CPU else "the batched encode lost its saving",
        ),
    ]


def adaptive_figures(e: dict[str, Any]) -> list[Figure]:
    """(e) concurrency auto against the best static value, one row per physics profile."""
    out: list[Figure] = []
    for prof in e["profiles"]:
        ratio, seed = prof["auto_vs_best"], prof["auto_vs_seed"]
        ok = ratio >= 0.97
        value = (
            f"{ratio:.3f}x best static ({prof['best_static']}); "
            f"{seed:.2f}x the seed's {prof['seed_static']}"
        )
        why = (
            ""
            if ok
            else (
                f"auto settled at {prof['auto_final_limit']} in flight with "
                f"{prof['auto_retracted']} retractions; the best static kept the server fuller"
            )
        )
        out.append(
            Figure("e", f"auto / best static, {prof['profile']}", value, ">= 0.97x", ok, why)
        )
    return out


def makespan_figures(f: dict[str, Any]) -> list[Figure]:
    """(f) makespan / bound and (g) CPU per record, one row each per concurrency policy."""
    out: list[Figure] = []
    for run in f["runs"]:
        ratio, tail = run["makespan_vs_bound"], run["tail_s"]
        value = f"{ratio:.2f}x ({run['makespan_s']:,.0f} / {run['bound_s']:,.0f} sim s)"
        why = ""
        if ratio > 1.05:
            busy, span = run["server_busy_s"], run["makespan_s"]
            gap, lag = run["client_gap_s"], run["emulator_lag_lost_s"]
            why = (
                f"the server worked {busy / run['bound_s']:.2f}x the bound (median "
                f"{run['median_running']:.0f} running, {tail:,.0f} s below a quarter of that: "
                f"the drain of the longest outputs, which the bound leaves out); without work "
                f"{gap:,.0f} s ({gap / span:.1%}) from client gaps and {lag:,.0f} s from the "
                f"emulator behind its clock; {run['retracted']} retractions"
            )
        out.append(
            Figure(
                "f",
                f"makespan / peak-capacity bound, {run['policy']}",
                value,
                "<= 1.05x",
                ratio <= 1.05,
                why,
            )
        )
    for run in f["runs"]:
        ms = run["cpu_ms_per_record"]
        out.append(
            Figure(
                "g",
                f"client CPU per record, flow process, {run['policy']}",
                f"{ms:.2f} ms ({run['records']:,} records)",
                "<= 1 ms",
                ms <= 1.0,
                "" if ms <= 1.0 else cpu_why(run),
            )
        )
    return out


def cpu_why(run: dict[str, Any]) -> str:
    """Why (g) missed: these records are long, and the flow's CPU grows with their tokens."""
    tokens = (run["output_tokens"] + run["prompt_tokens"]) / max(1, run["records"])
    us = 1e6 * run["flow_cpu_s"] / max(1, run["output_tokens"] + run["prompt_tokens"])
    return (
        f"records of ~{tokens:,.0f} tokens (prompt + output; (a)'s are ~450), "
        f"{us:.2f} us CPU per token; {run['flow_sys_cpu_s']:.1f} of the "
        f"{run['flow_cpu_s']:.1f} s in the kernel; the flow's lazy imports "
        f"({run['flow_import_cpu_s']:.1f} s) done before the clock. Where the rest goes: "
        "docs/performance.md, (g) profile"
    )


def details(r: dict[str, Any]) -> list[str]:
    """The numbers behind the figures."""
    lines = []
    if a := r.get("a"):
        lines += client_details(a)
    if b := r.get("b"):
        lines += utilization_details(b)
    if c := r.get("c"):
        lines += memory_details(c)
    if d := r.get("d"):
        lines += tokenize_details(d)
    if f := r.get("f"):
        lines += makespan_details(f)
    if h := r.get("h"):
        lines += logprob_cost.details(h)
    return lines


def client_details(a: dict[str, Any]) -> list[str]:
    """(a): both loops' rates and CPU, the emulator's ceiling, the Prefect task overhead."""
    rest = a["pipeline_cpu_ms"] - a["render_cpu_ms"]
    lines = [
        f"(a) {a['prompts']:,} prompts x {a['repeats']} runs, "
        f"~{a['output_tokens_per_record']:.0f} output tokens each, 150 in flight, "
        "zero-latency emulator; medians",
        f"    bare loop: {a['bare_rate']:,.0f} req/s, "
        f"{a['bare_cpu_ms']:.2f} ms CPU/record (HTTP + JSON only)",
        f"    pipeline:  {a['pipeline_rate']:,.0f} rec/s, "
        f"{a['pipeline_cpu_ms']:.2f} ms CPU/record = render {a['render_cpu_ms']:.2f} "
        f"+ the rest {rest:.2f}; rejected {a['pipeline_rejected']}",
        f"    emulator ceiling: ~{a['emulator_ceiling_rate']:,.0f} req/s on one core "
        f"({a['emulator_cpu_us']:.0f} us CPU per request): "
        + (
            "not what limits either side"
            if a["bare_rate"] < 0.7 * a["emulator_ceiling_rate"]
            else "close to the bare loop's rate, so it may limit the ratio"
        ),
    ]
    if "prefect_task_overhead_ms" in a:
        per_record = a["prefect_task_cpu_ms"] / 512
        lines.append(
            f"    Prefect: the partition subflow costs {a['prefect_task_overhead_ms']:.0f} ms "
            f"wall and {a['prefect_task_cpu_ms']:.0f} ms CPU per batch task more than the "
            f"library path ({a['prefect_batches']} tasks of {a['prefect_batch_size']} "
            f"prompts; with 512-prompt batches: {per_record:.3f} ms CPU per record)"
        )
    return lines


def utilization_details(b: dict[str, Any]) -> list[str]:
    """(b): the scenario, both schedules' utilization and the budget run."""
    return [
        f"(b) {b['prompts']:,} prompts in 3 partitions (tiers SHORT/MEDIUM/LONG), "
        f"{b['slots']} slots, {b['decode_ms']} ms/token decode, lognormal outputs",
        f"    side by side: {b['pipeline_utilization']:.1%} in {b['pipeline_wall_s']:.1f} s; "
        f"one after another: {b['sequential_utilization']:.1%} "
        f"in {b['sequential_wall_s']:.1f} s",
        "    from the work done (token counts x latency model, immune to late emulator "
        f"timers): {b['pipeline_nominal']:.1%} vs {b['sequential_nominal']:.1%}",
        f"    budget run (SHORT + LONG, max_tokens_in_flight {b['budget_cap_tokens']:,}): "
        f"peak {b['budget_peak_tokens']:,} tokens, {b['budget_peak_requests']} requests, "
        f"utilization {b['budget_utilization']:.1%} (from work: {b['budget_nominal']:.1%}); "
        f"the same partitions uncapped: {b['unbudgeted_utilization']:.1%}, "
        f"{b['unbudgeted_peak_tokens']:,} tokens reserved at the peak",
    ]


def memory_details(c: dict[str, Any]) -> list[str]:
    """(c): the big input's size and scan, the batches each input ran, the baseline RSS."""
    return [
        f"(c) {c['big_prompts']:,} prompts: {c['big_file_mb']:.0f} MB of JSONL, "
        f"{c['big_batches']:,} batches planned and every line parsed for the duplicate-id "
        f"scan ({c['big_scan_s']:.1f} s); batches generated: {c['batches_run']['big']} "
        f"({c['records_generated']['big']:,} records) vs {c['batches_run']['small']} "
        f"({c['records_generated']['small']:,}) for {c['small_prompts']:,} prompts",
        f"    RSS after imports and tokenizer: {c['baseline_mb']:.0f} MB",
        *near_scan_details(c),
    ]


def near_scan_details(c: dict[str, Any]) -> list[str]:
    """(c): the input scan's rate with the near-duplicate search and without."""
    if "big_near_scan_s" not in c:  # a saved run from before it was measured
        return []
    n, near, plain = c["big_prompts"], c["big_near_scan_s"], c["big_plain_scan_s"]
    return [
        f"    input scan of {n:,} prompts with the near-duplicate search (policy keep): "
        f"{near:.1f} s, {n / near:,.0f} lines/s; without it (policy off): {plain:.1f} s, "
        f"{n / plain:,.0f} lines/s; RSS right after it {c['big_near_scan_rss_mb']:.0f} MB; "
        f"{c['big_similar']:,} repeated prompts found",
    ]


def tokenize_details(d: dict[str, Any]) -> list[str]:
    """(d): the prompts, the CPU-time rates, and the tiktoken tokenizer's run if there was one."""
    lines = [
        f"(d) {d['prompts']:,} prompts of ~{d['tokens_per_prompt']:.0f} tokens, same ids on "
        f"both sides; CPU-time rates {d['batched_cpu_rate']:,.0f} vs "
        f"{d['naive_cpu_rate']:,.0f}/s ({d['cpu_speedup']:.2f}x)"
    ]
    if t := d.get("tiktoken"):
        lines.append(
            f"    tiktoken tokenizer (Kimi-K2.5's class path, Python): render "
            f"{t['batched_rate']:,.0f} vs naive {t['naive_rate']:,.0f}/s "
            f"({t['speedup']:.2f}x; CPU {t['cpu_speedup']:.2f}x), same ids on both sides"
        )
    return lines


def makespan_details(f: dict[str, Any]) -> list[str]:
    """(f) and (g): the tiers, then each policy's run: tokens, makespan, bound and where it went."""
    tiers = ", ".join(
        f"{t['name']} {t['concurrency']}/{t['max_tokens']} "
        f"({t['prompts']:,} x ~{t['mean_output']} out)"
        for t in f["tiers"]
    )
    lines = [
        f"(f) {f['profile']} at time scale {f['time_scale']}, prompt-count scale "
        f"{f['scale']:g}; tiers (in flight/max_tokens): {tiers}"
    ]
    for run in f["runs"]:
        lines.append(
            f"    {run['policy']}: {run['records']:,} records, {run['output_tokens']:,} "
            f"output + {run['prompt_tokens']:,} prompt tokens; makespan "
            f"{run['makespan_s']:,.0f} sim s (server busy {run['server_busy_s']:,.0f}), bound "
            f"{run['bound_s']:,.0f} = decode {run['decode_s']:,.0f} at the peak "
            f"{run['peak_tok_s']:,.0f} tok/s + prefill {run['prefill_s']:,.0f}; median "
            f"{run['median_running']:.0f} running, {run['retracted']} retractions, emulator "
            f"lag {run['emulator_lag_s']:.2f} s (lost {run['emulator_lag_lost_s']:.1f} sim s), "
            f"client gaps {run['client_gap_s']:.1f} sim s, start-up (smoke request to the "
            f"first batch request) {run['startup_s']:.1f} s wall; flow "
            f"{run['flow_wall_s']:.0f} s wall, {run['flow_cpu_s']:.1f} s CPU (imports done "
            f"before the clock: {run['flow_import_cpu_s']:.1f} s)"
        )
    return lines


def table(figs: list[Figure]) -> str:
    rows = [f"{'':3} {'figure':50} {'measured':34} {'target':20} verdict"]
    for f in figs:
        verdict = f.verdict + (f": {f.why}" if f.why else "")
        rows.append(f"({f.part}) {f.name:50} {f.value:34} {f.target:20} {verdict}")
    return "\n".join(rows)


def markdown(figs: list[Figure]) -> str:
    rows = ["| | figure | measured | target | verdict |", "|---|---|---|---|---|"]
    for f in figs:
        verdict = f"**{f.verdict}**" + (f": {f.why}" if f.why else "")
        rows.append(f"| ({f.part}) | {f.name} | {f.value} | {f.target} | {verdict} |")
    return "\n".join(rows)


def record(path: Path, results: dict[str, Any], figs: list[Figure]) -> None:
    """Prepend this run's entry to the results file and say where it went."""
    entry = results_md.entry(results["machine"], results["mode"], results["scale"], markdown(figs))
    results_md.prepend(path, entry)
    print(f"figures written to {path}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--quick", action="store_true", help="smaller sizes (indicative figures)")
    p.add_argument("--scale", type=float, default=1.0, help="multiply every size (tests: 0.1)")
    p.add_argument("--only", default="abcdefh", help="parts to run, e.g. 'ad' ('f' gives (g))")
    p.add_argument("--no-prefect", action="store_true", help="skip the Prefect flow overhead")
    p.add_argument("--json", type=Path, help="write every number to this file")
    p.add_argument("--markdown", action="store_true", help="also print the figures table")
    p.add_argument(
        "--results",
        type=Path,
        help="prepend this run's figures to this file (default: benchmarks/RESULTS.md, "
        "full runs only)",
    )
    p.add_argument("--no-results", action="store_true", help="write no results file")
    p.add_argument("--from-json", type=Path, help="print the report of a saved --json run")
    p.add_argument(
        "--gate",
        action="store_true",
        help="exit 1 when a ratio figure ((b)-(f)) misses what CI holds it to; a missed "
        "part is run once more first (CI's machine is shared)",
    )
    args = p.parse_args(argv)
    if args.from_json:
        saved = json.loads(args.from_json.read_text())
        figs = figures(saved)
        print(table(figs), "", *details(saved), sep="\n")
        if args.markdown:
            print("", markdown(figs), sep="\n")
        if args.results and not args.no_results:  # a saved run goes in only when asked
            record(args.results, saved, figs)
        return 0

    s = sizes(args.quick, args.scale)
    info = machine()
    mode = "quick" if args.quick else "full"
    print(
        f"eagle3-datagen benchmark ({mode}, scale {args.scale:g}): {info['nproc']} cores, "
        f"{info['cpu']}, Python {info['python']}, {info['date']}",
        flush=True,
    )
    results: dict[str, Any] = {"machine": info, "mode": mode, "scale": args.scale}
    steps = [
        (
            "a",
            "client overhead",
            lambda: client_overhead.measure(
                s["a_prompts"],
                s["a_repeats"],
                prefect=not args.no_prefect and not args.quick,
                flow_prompts=s["a_flow_prompts"],
            ),
        ),
        ("b", "slot utilization", lambda: utilization.measure(s["b"])),
        ("c", "peak memory", lambda: memory.measure(s["c_small"], s["c_big"])),
        ("d", "tokenization rate", lambda: tokenize_rate.measure(s["d_prompts"])),
        ("e", "auto vs static concurrency", lambda: adaptive.measure(s["e_scale"])),
        ("f", "makespan and CPU per record, Prefect flow", lambda: makespan.measure(s["f_scale"])),
        ("h", "logprobs: bytes and CPU per record", lambda: logprob_cost.measure(s["h_prompts"])),
    ]
    for key, label, run in steps:
        if key not in args.only:
            continue
        t0 = time.monotonic()
        print(f"  ({key}) {label} ...", end="", flush=True)
        results[key] = run()
        print(f" {time.monotonic() - t0:.0f} s", flush=True)
    if args.gate:  # one more run of each part a gated figure missed in: a loaded machine's noise
        for key, label, run in steps:
            if key in args.only and gate_failures(figures({key: results[key]})):
                print(f"  ({key}) {label}, once more (a gated figure missed) ...", flush=True)
                results[key] = run()
    info["loadavg_end"] = os.getloadavg()

    figs = figures(results)
    print()
    print(table(figs))
    print()
    print("\n".join(details(results)))
    print(
        f"\nload average at start {info['loadavg_start'][0]:.1f}, at end "
        f"{info['loadavg_end'][0]:.1f} (other processes share these cores)"
    )
    if args.quick:
        print("quick mode: sizes too small for the targets; run without --quick for the figures")
    if args.markdown:
        print()
        print(markdown(figs))
    results["figures"] = [f.__dict__ | {"verdict": f.verdict} for f in figs]
    target = args.results or (None if args.quick else results_md.DEFAULT_PATH)
    if target and not args.no_results:
        record(target, results, figs)
        if target == results_md.DEFAULT_PATH and readme_summary.update():
            print(f"performance summary rewritten in {readme_summary.README}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2, default=str))
    if args.gate and (failed := gate_failures(figs)):
        for f, limit in failed:
            print(f"gate: ({f.part}) {f.name}: {f.value} misses {limit}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
