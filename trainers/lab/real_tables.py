"""The real lab's tables from real_measure.py's measurements: seeds, intervals, a learning curve.

Every accept length is mean ± sd over seeds (draft initialisation and data order; for the
learning curve's random subsets also which records a subset holds: one drawn per seed).
Every difference is a paired bootstrap 95 % interval over held-out prompts
(``eagle3_datagen.report.intervals``): a prompt's group is its committed tokens and verify steps
summed over the seeds, so the interval covers the prompts' spread with the seeds pooled; where
it includes 0 the table says "no difference".

The held-out records split in two by a hash of their id: set A, on which every table is read,
and set B, which only re-checks the headline (regenerated minus original).

usage: python real_tables.py SUMMARY_JSON REAL_DIR TARGET_DIR [--small] [--results MD]
       [--plot PNG]
Merges ``real``, ``learning_curve``, ``learning_curve_same_compute`` (the curve's subsets
trained for the full draft's steps) and ``selection_real`` into SUMMARY_JSON (its
``lossless_mismatches`` grows by the real drafts'), and prepends a dated entry to MD.
"""

import hashlib
import json
import os
import sys
import time
from pathlib import Path

from eagle3_datagen.report.intervals import NO_DIFFERENCE, paired_difference, seed_spread


def half(record_id: str) -> str:
    return "A" if hashlib.sha256(record_id.encode()).digest()[0] % 2 == 0 else "B"


def by_name(drafts: dict) -> dict[str, dict[str, dict]]:
    """'name-seed' -> {name: {seed: measurement}}."""
    out: dict[str, dict[str, dict]] = {}
    for key, value in drafts.items():
        name, _, seed = key.rpartition("-")
        out.setdefault(name, {})[seed] = value
    return out


def select_rows(groups: list, keep: list[bool]) -> list[tuple[float, float]]:
    return [(float(g[0]), float(g[1])) for g, k in zip(groups, keep, strict=True) if k]


def ratio(groups: list[tuple[float, float]]) -> float:
    steps = sum(g[1] for g in groups)
    return sum(g[0] for g in groups) / steps if steps else float("nan")


def spread(runs: dict[str, dict], keep: list[bool]) -> dict:
    values = [ratio(select_rows(run["groups"], keep)) for _, run in sorted(runs.items())]
    s = seed_spread(values).to_dict(3)
    return {"mean": s["mean"], "sd": s["sd"], "seeds": s["seeds"], "values": s["values"]}


def pooled(runs: dict[str, dict], keep: list[bool]) -> list[tuple[float, float]]:
    """Per held-out prompt: (tokens, verify steps) summed over the seeds."""
    rows = [select_rows(run["groups"], keep) for run in runs.values()]
    return [(sum(r[i][0] for r in rows), sum(r[i][1] for r in rows)) for i in range(len(rows[0]))]


def difference(a: dict, b: dict, keep: list[bool]) -> dict:
    if not any(keep):
        raise SystemExit("real_tables: a held-out set is empty (too few prompts)")
    iv = paired_difference(pooled(a, keep), pooled(b, keep))
    out = {"mean": round(iv.estimate, 3), "ci95": [round(iv.low, 3), round(iv.high, 3)]}
    if iv.low <= 0 <= iv.high:
        out["verdict"] = NO_DIFFERENCE
    return out


def scored_run(real: Path) -> dict | None:
    """The generation run that speculated with the incumbent draft (for ``acceptance``): its
    time and tokens/s (the same outputs as the plain run: real.sh checks the ids)."""
    path = real / "score.json"
    if not path.exists():
        return None
    run = json.loads(path.read_text())
    return {**run, "tokens_per_s": round(generated_tokens(real) / max(run["seconds"], 1), 1)}


def generated_tokens(real: Path) -> int:
    """The target's output tokens in the generation run (the export's supervised tokens)."""
    total = 0
    for name in ("speculators.jsonl", "speculators.validation.jsonl"):
        for line in (real / "regenerated" / name).read_text().splitlines():
            if line.strip():
                total += sum(json.loads(line)["loss_mask"])
    return total


def rows_of(path: Path) -> int:
    return sum(1 for line in path.read_text().splitlines() if line.strip())


def subset_rows(real: Path, name: str) -> int:
    """A subset's training rows; for subsets drawn per seed (sub-NAME-sS), their mean."""
    dirs = sorted(real.glob(f"sub-{name}-s*")) or [real / f"sub-{name}"]
    return round(sum(rows_of(d / "speculators.jsonl") for d in dirs) / len(dirs))


def main(summary_path: str, real_dir: str, target_dir: str, *opts: str) -> None:
    real = Path(real_dir)
    parts = [json.loads(p.read_text()) for p in sorted(real.glob("measure-*.json"))]
    measured = parts[0]
    for part in parts[1:]:  # the drafts were measured by several processes, same prompts
        if part["ids"] != measured["ids"]:
            raise SystemExit(f"{real}: the measurements disagree on the held-out prompts")
        measured["drafts"].update(part["drafts"])
    target = json.loads((Path(target_dir) / "lab-target.json").read_text())
    sides = [half(i) for i in measured["ids"]]
    in_a = [s == "A" for s in sides]
    in_b = [s == "B" for s in sides]
    drafts = by_name(measured["drafts"])
    mismatches = sum(d["mismatches"] for d in measured["drafts"].values())
    live = [d for d in measured["drafts"].values() if "live_groups" in d]
    accept = {n: spread(drafts[n], in_a) for n in ("untrained", "original", "regenerated")}
    table = {
        "target": target["name"],
        "target_parameters": target["parameters"],
        "heldout_records": len(sides),
        "heldout_a": sum(in_a),
        "heldout_b": sum(in_b),
        "train_records": rows_of(real / "regenerated/speculators.jsonl"),
        "max_new_tokens": measured["max_new_tokens"],
        "accept_length": accept,
        "accept_length_b": {
            n: spread(drafts[n], in_b) for n in ("untrained", "original", "regenerated")
        },
        "lossless_mismatches": mismatches,
        "measurement": {
            "method": "replay (trainers/lab/replay.py) on every held-out prompt",
            "reference_breaks": measured["reference_breaks"],
            "live_prompts": measured["live_prompts"],
            "live_drafts": len(live),
            "live_reference_differs": measured["live_reference_differs"],
            "replay_disagreements": sum(d["replay_disagreements"] for d in live),
            "live_steps": sum(d["live_steps"] for d in live),
            "replay_steps_on_live": sum(d["replay_steps_on_live"] for d in live),
        },
        "difference": {
            "regenerated_minus_original": difference(
                drafts["regenerated"], drafts["original"], in_a
            ),
            "regenerated_minus_original_b": difference(
                drafts["regenerated"], drafts["original"], in_b
            ),
        },
        "generation_seconds": json.loads((real / "generate.json").read_text())["seconds"],
        # runs before REAL_GEN_THREADS decoded on one thread
        "generation_threads": json.loads((real / "generate.json").read_text()).get("threads", 1),
        "plain_tokens_per_s": round(
            measured["plain"]["tokens"] / max(measured["plain"]["seconds"], 1e-9), 1
        ),
        "batched_tokens_per_s": round(
            generated_tokens(real)
            / max(json.loads((real / "generate.json").read_text())["seconds"], 1),
            1,
        ),
        "scored_run": scored_run(real),
        "speculating_tokens_per_s": {
            n: round(
                sum(sum(g[0] for g in r["live_groups"]) for r in runs.values() if "seconds" in r)
                / max(sum(r.get("seconds", 0) for r in runs.values()), 1e-9),
                1,
            )
            for n, runs in drafts.items()
            if any("live_groups" in r for r in runs.values())
        },
    }
    full_rows = table["train_records"]
    fractions = sorted((n.split("-")[1] for n in drafts if n.startswith("random-")), key=float)
    curve = [
        {
            "fraction": float(f),
            "train_rows": subset_rows(real, f"random-{f}"),
            **spread(drafts[f"random-{f}"], in_a),
        }
        for f in fractions
    ]
    curve.append({"fraction": 1.0, "train_rows": full_rows, **accept["regenerated"]})
    same_compute = []  # the same random subsets trained for the full draft's steps
    for f in fractions:
        if f"random+full-{f}" not in drafts:
            continue
        diff = difference(drafts[f"random+full-{f}"], drafts["regenerated"], in_a)
        same_compute.append(
            {
                "fraction": float(f),
                "train_rows": subset_rows(real, f"random-{f}"),
                **spread(drafts[f"random+full-{f}"], in_a),
                "minus_full": diff["mean"],
                "ci95_vs_full": diff["ci95"],
                "verdict": diff.get("verdict", "better" if diff["mean"] > 0 else "worse"),
            }
        )
    selection = []
    for name, runs in sorted(drafts.items()):
        rule, _, f = name.rpartition("-")
        if rule in ("", "random", "random+full") or f not in fractions:
            continue
        diff = difference(runs, drafts[f"random-{f}"], in_a)
        row = {
            "rule": rule,
            "fraction": float(f),
            "train_rows": subset_rows(real, name),
            **spread(runs, in_a),
        }
        row["ci95_vs_random"] = diff["ci95"]
        row["minus_random"] = diff["mean"]
        row["verdict"] = diff.get("verdict", "better" if diff["mean"] > 0 else "worse")
        selection.append(row)
    summary = json.loads(Path(summary_path).read_text()) if Path(summary_path).exists() else {}
    summary["lossless_mismatches"] = summary.get("lossless_mismatches", 0) + mismatches
    summary["real"] = table
    summary["learning_curve"] = curve
    summary["learning_curve_same_compute"] = same_compute
    summary["selection_real"] = selection
    Path(summary_path).write_text(json.dumps(summary, indent=1))
    text = render(table, curve, selection, same_compute)
    print(text)
    if "--plot" in opts:
        plot(curve, accept, opts[opts.index("--plot") + 1], same_compute)
    if "--results" in opts:
        append_results(opts[opts.index("--results") + 1], text, "--small" in opts, table)


def render(
    table: dict, curve: list[dict], selection: list[dict], same_compute: list[dict] = ()
) -> str:
    def ms(d: dict) -> str:
        return f"{d['mean']:.3f} ± {d['sd']:.3f} ({d['seeds']} seeds)"

    a, b = table["accept_length"], table["accept_length_b"]
    d, db = (
        table["difference"][k]
        for k in ("regenerated_minus_original", "regenerated_minus_original_b")
    )
    lines = [
        f"Target {table['target']} ({table['target_parameters']:,} parameters); "
        f"{table['train_records']} training records, held-out {table['heldout_records']} "
        f"(set A {table['heldout_a']}, set B {table['heldout_b']}), temperature 0, max "
        f"{table['max_new_tokens']} new tokens; lossless mismatches "
        f"{table['lossless_mismatches']}.",
        "",
        "| draft trained on | accept length, set A | set B (check) |",
        "|---|---|---|",
    ]
    for n in ("untrained", "original", "regenerated"):
        lines.append(f"| {n} | {ms(a[n])} | {ms(b[n])} |")

    def dtext(x: dict) -> str:
        verdict = f" ({x['verdict']})" if "verdict" in x else ""
        return f"{x['mean']:+.3f}, 95 % CI [{x['ci95'][0]:+.3f}, {x['ci95'][1]:+.3f}]{verdict}"

    lines += [
        "",
        f"Regenerated minus original: set A {dtext(d)}; set B {dtext(db)}.",
        "",
        "| learning curve: fraction of the regenerated records | training rows | accept length |",
        "|---|---|---|",
    ]
    lines += [f"| {r['fraction']:g} | {r['train_rows']} | {ms(r)} |" for r in curve]
    if same_compute:
        lines += [
            "",
            "| the same subsets, as many steps as all the records | training rows | accept "
            "length | minus all the records, 95 % CI | verdict |",
            "|---|---|---|---|---|",
        ]
        for r in same_compute:
            lo, hi = r["ci95_vs_full"]
            lines.append(
                f"| {r['fraction']:g} | {r['train_rows']} | {ms(r)} | {r['minus_full']:+.3f} "
                f"[{lo:+.3f}, {hi:+.3f}] | {r['verdict']} |"
            )
    if selection:
        lines += [
            "",
            "| select rule | fraction | accept length | minus random, 95 % CI | verdict |",
            "|---|---|---|---|---|",
        ]
        for r in selection:
            lo, hi = r["ci95_vs_random"]
            lines.append(
                f"| {r['rule']} | {r['fraction']:g} | {ms(r)} | {r['minus_random']:+.3f} "
                f"[{lo:+.3f}, {hi:+.3f}] | {r['verdict']} |"
            )
    m = table["measurement"]
    lines += [
        "",
        f"Measured by replay on every held-out prompt (the target's greedy output, its argmax "
        f"at every position: {m['reference_breaks']} breaks); the emulator's live speculating "
        f"loop on {m['live_prompts']} prompts for {m['live_drafts']} drafts: "
        f"{table['lossless_mismatches']} lossless mismatches, live and replayed counts differ on "
        f"{m['replay_disagreements']} of {m['live_prompts'] * m['live_drafts']} prompt-draft "
        f"pairs (verify steps live {m['live_steps']}, replayed {m['replay_steps_on_live']}).",
    ]
    lines += [
        "",
        f"Speed: the generation run (the pipeline against the batched backend, 8 in flight, "
        f"{table['generation_threads']} threads) {table['generation_seconds']} s, "
        f"{table['batched_tokens_per_s']} output tokens/s"
        + (
            f"; the scored run (the same prompts speculating with the original draft, chain of "
            f"3, batched, threads: {scored['threads']}, beside the trainings) "
            f"{scored['seconds']} s, {scored['tokens_per_s']} tokens/s"
            if (scored := table.get("scored_run"))
            else ""
        )
        + f"; the live sample as one batch, one thread per process: plain "
        f"{table['plain_tokens_per_s']} tokens/s, speculating with the "
        + ", ".join(f"{n} draft {v}" for n, v in table["speculating_tokens_per_s"].items())
        + " tokens/s.",
    ]
    return "\n".join(lines)


def plot(curve: list[dict], accept: dict, out: str, same_compute: list[dict] = ()) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.4))
    x = [r["train_rows"] for r in curve]
    ax.errorbar(
        x,
        [r["mean"] for r in curve],
        yerr=[r["sd"] for r in curve],
        marker="o",
        capsize=3,
        label="regenerated, random subsets (same epochs)",
    )
    if same_compute:
        ax.errorbar(
            [r["train_rows"] for r in same_compute] + [curve[-1]["train_rows"]],
            [r["mean"] for r in same_compute] + [curve[-1]["mean"]],
            yerr=[r["sd"] for r in same_compute] + [curve[-1]["sd"]],
            marker="s",
            capsize=3,
            label="the same subsets, the full draft's steps",
        )
    for name, style in (("original", "--"), ("untrained", ":")):
        ax.axhline(accept[name]["mean"], linestyle=style, color="grey", label=f"{name} (all rows)")
    ax.set_xlabel("training records")
    ax.set_ylabel("accept length (mean ± sd, seeds)")
    ax.set_title("SmolLM2-135M-Instruct: accept length by data size", fontsize=10)
    ax.legend(fontsize=7)
    fig.tight_layout()
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    print(f"plot: {out}")


REAL_HEADING = "## Real-model tables (`LAB_TABLES=real trainers/lab.sh`, docs/lab-real.md)"


def append_results(md: str, text: str, small: bool, table: dict) -> None:
    """A dated entry at the top of the results file's real-model section (newest first)."""
    path = Path(md)
    old = path.read_text() if path.exists() else "# The lab's results\n"
    if REAL_HEADING not in old:
        old = old.rstrip("\n") + (
            f"\n\n{REAL_HEADING}\n\nDated entries, newest first: each run with the real "
            "tables adds one here.\n"
        )
    head, _, rest = old.partition(REAL_HEADING)
    intro, sep, entries = rest.partition("\n### ")
    load = os.getloadavg()
    entry = (
        f"\n### {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}: "
        f"`LAB_TABLES=real trainers/lab.sh{' --small' if small else ''}`\n\n"
        f"Machine: {os.cpu_count()} cores shared with other work, load average {load[0]:.1f} at "
        f"the end; OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', '?')}; lab time "
        f"{os.environ.get('LAB_SECONDS', '?')} s.\n\n{text}\n"
    )
    body = intro.rstrip("\n") + "\n" + entry + (("\n### " + entries) if sep else "")
    path.write_text(head + REAL_HEADING + body)
    print(f"results: {path}")


if __name__ == "__main__":
    main(*sys.argv[1:])
