"""The lab's tables, with their uncertainty, from the files trainers/lab.sh left in WORK.

usage: python summary.py OUT_JSON WORK SEEDS TABLES
  SEEDS:  the draft seeds, e.g. "0 1 2" (speculators' --seed: initialisation and batch order)
  TABLES: the tables that ran, e.g. "main selection modes"

Every accept length is measured once per seed and reported as mean ± sd over seeds
(``report.intervals.seed_spread``); its 95 % interval, and every difference a table claims, is
a bootstrap over the held-out prompts of the seeds pooled per prompt (each prompt's committed
tokens and verify steps summed over the seeds: ``ratio_interval``, ``paired_difference``); a
difference whose interval holds 0 is "no difference". The lossless check compares every
speculating run's output ids with transformers' own ``generate`` on the target (reference.py).

Files read (WORK/...): reference.json, measure-plain.json, measure-DRAFT-seedS.json and
eval-DRAFT.json (seed 0); second/reference.json and second/measure-DRAFT-seedS.json (the second
held-out set); selection/RULE-seedS.json and .train.json; modes/table.json (modes.py).
"""

import json
import sys
from pathlib import Path

from eagle3_datagen.report.intervals import paired_difference, ratio_interval, seed_spread

DRAFTS = ("untrained", "original", "original_reasoning", "regenerated")
DIFFERENCES = (  # (a, b): the table claims a - b
    ("regenerated", "original"),
    ("original_reasoning", "original"),
    ("regenerated", "original_reasoning"),
)
PARTS = ("reasoning", "answer")


def _load(path: Path) -> dict:
    return json.loads(path.read_text())


def units(run: dict, part: str = "") -> dict[str, tuple[float, float]]:
    """Each held-out prompt's (committed tokens, verify steps), whole or for one part."""
    out = {}
    for r in run["outputs"]:
        unit = r.get("split", {}).get(part) if part else r.get("accept")
        if unit:
            out[r["id"]] = (float(unit[0]), float(unit[1]))
    return out


def pooled(runs: list[dict], part: str = "") -> dict[str, tuple[float, float]]:
    """Per prompt, summed over the seeds' runs (only prompts every run has)."""
    per = [units(run, part) for run in runs]
    common = set.intersection(*(set(u) for u in per)) if per else set()
    return {k: (sum(u[k][0] for u in per), sum(u[k][1] for u in per)) for k in sorted(common)}


def _ratio(groups: dict[str, tuple[float, float]]) -> float | None:
    den = sum(d for _, d in groups.values())
    return sum(n for n, _ in groups.values()) / den if den else None


def spread(runs: list[dict], part: str = "") -> dict | None:
    values = [v for v in (_ratio(units(run, part)) for run in runs) if v is not None]
    if not values:
        return None
    result = seed_spread(values).to_dict()
    groups = list(pooled(runs, part).values())
    if groups:
        result["ci95"] = ratio_interval(groups).as_list()
    return result


def difference(a: list[dict], b: list[dict], part: str = "") -> dict | None:
    """``a`` minus ``b``, paired by prompt, seeds pooled; with the table's verdict."""
    ga, gb = pooled(a, part), pooled(b, part)
    keys = sorted(set(ga) & set(gb))
    if not keys:
        return None
    interval = paired_difference([ga[k] for k in keys], [gb[k] for k in keys])
    return {
        "mean": round(interval.estimate, 4),
        "ci95": interval.as_list(),
        "verdict": interval.verdict(),
        "prompts": len(keys),
    }


def mismatches(reference: dict, runs: list[dict]) -> int:
    ids = {r["id"]: r["output_ids"] for r in reference["outputs"]}
    return sum(ids.get(r["id"]) != r["output_ids"] for run in runs for r in run["outputs"])


def _runs(folder: Path, stem: str, seeds: list[str]) -> list[dict]:
    paths = [folder / f"{stem}-seed{s}.json" for s in seeds]
    return [_load(p) for p in paths if p.exists()]


def _text(s: dict | None) -> str:
    if s is None:
        return "-"
    ci = s.get("ci95")
    return f"{s['mean']:.3f} ± {s['sd']:.3f}" + (f" [{ci[0]:.3f}, {ci[1]:.3f}]" if ci else "")


def _diff_text(d: dict | None) -> str:
    if d is None:
        return "-"
    return f"{d['mean']:+.3f} [{d['ci95'][0]:+.3f}, {d['ci95'][1]:+.3f}] {d['verdict']}"


def main_table(work: Path, seeds: list[str]) -> dict:
    reference = _load(work / "reference.json")
    plain = _load(work / "measure-plain.json")
    runs = {d: _runs(work, f"measure-{d}", seeds) for d in DRAFTS}
    runs = {d: r for d, r in runs.items() if r}
    accept, by_eval, details, spreads, by_part, lossless = {}, {}, {}, {}, {}, {}
    for name, rs in runs.items():
        spreads[name] = spread(rs)
        accept[name] = spreads[name]["mean"] if spreads[name] else None
        by_part[name] = {p: spread(rs, p) for p in PARTS}
        lossless[name] = mismatches(reference, rs)
        s = rs[0]["summary"]
        details[name] = {
            k: s[k]
            for k in (
                "verify_ct",
                "num_correct_drafts",
                "completion_tokens",
                "accept_rate",
                "position_conditional",
            )
        }
        evaluated = work / f"eval-{name}.json"
        if evaluated.exists():
            by_eval[name] = _load(evaluated)["accept_length"]
    plain_mismatches = mismatches(reference, [plain])
    summary = {
        "heldout_records": plain["records"],
        "seeds": [int(s) for s in seeds],
        "accept_length": accept,
        "accept_length_seeds": spreads,
        "accept_length_by_part": by_part,
        "difference": {},
        "difference_by_part": {},
        "lossless_reference": "transformers generate (greedy), trainers/lab/reference.py",
        "lossless_mismatches": sum(lossless.values()) + plain_mismatches,
        "lossless_mismatches_by_draft": lossless,
        "lossless_mismatches_plain": plain_mismatches,
        "details": details,
    }
    for a, b in DIFFERENCES:
        if a in runs and b in runs:
            key = f"{a}_minus_{b}"
            summary["difference"][key] = difference(runs[a], runs[b])
            summary["difference_by_part"][key] = {p: difference(runs[a], runs[b], p) for p in PARTS}
    if by_eval:
        summary["accept_length_eval"] = by_eval
    second = work / "second"
    if (second / "reference.json").exists():
        runs2 = {d: _runs(second, f"measure-{d}", seeds) for d in ("original", "regenerated")}
        lost = mismatches(
            _load(second / "reference.json"), runs2["original"] + runs2["regenerated"]
        )
        summary["lossless_mismatches"] += lost
        summary["second_heldout"] = {
            "records": _load(second / "reference.json")["records"],
            "accept_length": {d: spread(r) for d, r in runs2.items()},
            "difference": {
                "regenerated_minus_original": difference(runs2["regenerated"], runs2["original"])
            },
            "lossless_mismatches": lost,
        }
    n = len(seeds)
    print(f"held-out prompts: {plain['records']} (temperature 0), {n} seeds: mean ± sd [95 % CI]")
    print(
        f"{'draft':<20} {'accept length':<32} {'reasoning tokens':<32} {'answer tokens':<32} mism."
    )
    for name in runs:
        parts = by_part[name]
        print(
            f"{name:<20} {_text(spreads[name]):<32} {_text(parts['reasoning']):<32} "
            f"{_text(parts['answer']):<32} {lossless[name]}"
        )
    for key, d in summary["difference"].items():
        parts = summary["difference_by_part"][key]
        print(
            f"{key}: {_diff_text(d)}  (reasoning {_diff_text(parts['reasoning'])}; "
            f"answer {_diff_text(parts['answer'])})"
        )
    print(f"plain server against transformers generate: {plain_mismatches} mismatches")
    for name, value in by_eval.items():
        print(f"eagle3-datagen eval, {name} draft (seed 0): accept length {value:.3f}")
    if "second_heldout" in summary:
        s2 = summary["second_heldout"]
        print(
            f"second held-out set ({s2['records']} prompts, decides nothing): "
            + "  ".join(f"{d} {_text(v)}" for d, v in s2["accept_length"].items())
            + "  regenerated - original "
            + _diff_text(s2["difference"]["regenerated_minus_original"])
        )
    return summary


def selection_table(work: Path, seeds: list[str], reference: dict) -> list[dict]:
    folder = work / "selection"
    rules = sorted(
        {
            p.name.split("-seed")[0]
            for p in folder.glob("*-seed*.json")
            if not p.name.endswith(".train.json")
        }
    )
    full = _runs(work, "measure-regenerated", seeds)
    runs = {"full": full, **{rule: _runs(folder, rule, seeds) for rule in rules}}
    table = []
    for rule, rs in runs.items():
        stem = "full" if rule == "full" else f"{rule}-seed{seeds[0]}"
        train = folder / f"{stem}.train.json"
        row = {"rule": rule, **(spread(rs) or {}), **(_load(train) if train.exists() else {})}
        row["accept_length"] = row.get("mean")
        row["lossless_mismatches"] = mismatches(reference, rs)
        # RULE[@KEEP][+BUDGET]: a keep fraction not 0.5; +compute: the same steps for every row
        name, plus, budget = rule.partition("+")
        base, at, keep = name.partition("@")
        row["keep"] = float(keep) if at else (1.0 if rule == "full" else 0.5)
        if plus:
            row["budget"] = budget
        random = f"random{at}{keep}{plus}{budget}"
        if base not in ("random", "full") and random in runs:
            row["ci95_vs_random"] = difference(rs, runs[random])
        if rule != "full":
            row["ci95_vs_full"] = difference(rs, full)
        table.append(row)
    print("selection (RULE@KEEP; --keep 0.5 without @), mean ± sd over seeds [95 % CI]:")
    for r in table:
        print(
            f"select {r['rule']:<12} {_text(r if 'mean' in r else None):<32} "
            f"vs random {_diff_text(r.get('ci95_vs_random'))}  "
            f"mismatches {r['lossless_mismatches']}"
        )
    return table


def main(out: str, work_dir: str, seeds_text: str, tables_text: str) -> None:
    work, seeds, tables = Path(work_dir), seeds_text.split(), tables_text.split()
    summary: dict = {"lossless_mismatches": 0}
    if "main" in tables:
        summary = main_table(work, seeds)
    if "selection" in tables:
        table = selection_table(work, seeds, _load(work / "reference.json"))
        summary["selection"] = {r["rule"]: r["accept_length"] for r in table if r["rule"] != "full"}
        summary["selection_table"] = table
        summary["lossless_mismatches"] += sum(r["lossless_mismatches"] for r in table[1:])
    if "modes" in tables:
        modes = _load(work / "modes" / "table.json")
        summary["lossless_mismatches"] += modes["lossless_mismatches"]
        summary["accept_length_by_mode"] = modes["accept_length_by_mode"]
        summary["modes"] = modes
    Path(out).write_text(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main(*sys.argv[1:5])
