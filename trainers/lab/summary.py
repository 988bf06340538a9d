"""The lab's table: held-out accept length per draft, and the verifier's honesty at temperature 0
(every held-out prompt's output ids with speculation equal those without).

usage: python summary.py OUT_JSON [PLAIN_JSON NAME=MEASURE_JSON ...] [--selection DIR ROW ...]
                         [--modes TABLE_JSON]

Where ``eval-NAME.json`` lies beside NAME's measure file (``eagle3-datagen eval --json``, the
same held-out split, each record's own sampling), its accept length is ``accept_length_eval``.

With ``--selection``: the selection table (issue #35, docs/selection-lab.md), one row per name,
from DIR/ROW.json (measure.py's output) and DIR/ROW.train.json (steps, wall seconds, rows).

With ``--modes``: the modes table (issue #34, docs/modes-lab.md) from trainers/lab/modes.py's
table.json: ``accept_length_by_mode`` (draft -> mode -> accept length) and its details; its
lossless mismatches join ``lossless_mismatches``.
"""

import json
import sys
from pathlib import Path


def selection_table(ids: dict, folder: str, rows: list[str]) -> list[dict]:
    table = []
    for name in rows:
        run = json.loads((Path(folder) / f"{name}.json").read_text())
        train = json.loads((Path(folder) / f"{name}.train.json").read_text())
        mismatches = sum(ids.get(r["id"]) != r["output_ids"] for r in run["outputs"])
        table.append(
            {
                "rule": name,
                "accept_length": run["accept_length"],
                **train,
                "lossless_mismatches": mismatches,
            }
        )
    return table


def main(out: str, *args: str) -> None:
    modes = None
    if "--modes" in args:
        at = args.index("--modes")
        modes = json.loads(Path(args[at + 1]).read_text())
        args = args[:at] + args[at + 2 :]
    summary = main_table(*args) if args else {"lossless_mismatches": 0}
    if modes is not None:
        summary["lossless_mismatches"] += modes["lossless_mismatches"]
        summary["accept_length_by_mode"] = modes["accept_length_by_mode"]
        summary["modes"] = modes
        print(f"modes (held-out prompts {modes['heldout_prompts']}):")
        for draft, by in modes["accept_length_by_mode"].items():
            text = "  ".join(f"on {mode} {value:.3f}" for mode, value in by.items())
            print(f"draft on {draft:<14} {text}")
    Path(out).write_text(json.dumps(summary, indent=1))


def main_table(plain: str, *args: str) -> dict:
    named, rows = args, []
    if "--selection" in args:
        at = args.index("--selection")
        named, rows = args[:at], list(args[at + 1 :])
    base = json.loads(Path(plain).read_text())
    ids = {r["id"]: r["output_ids"] for r in base["outputs"]}
    accept, mismatches, details, by_eval = {}, {}, {}, {}
    for item in named:
        name, _, path = item.partition("=")
        run = json.loads(Path(path).read_text())
        accept[name] = run["accept_length"]
        evaluated = Path(path).with_name(f"eval-{name}.json")
        if evaluated.exists():
            by_eval[name] = json.loads(evaluated.read_text())["accept_length"]
        mismatches[name] = sum(ids.get(r["id"]) != r["output_ids"] for r in run["outputs"])
        s = run["summary"]
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
    summary = {
        "heldout_records": base["records"],
        "accept_length": accept,
        "lossless_mismatches": sum(mismatches.values()),
        "lossless_mismatches_by_draft": mismatches,
        "details": details,
    }
    if by_eval:
        summary["accept_length_eval"] = by_eval
    if rows:
        table = selection_table(ids, rows[0], rows[1:])
        summary["selection"] = {r["rule"]: r["accept_length"] for r in table}
        summary["selection_table"] = table
    print(f"held-out prompts: {base['records']} (temperature 0)")
    print(f"{'draft':<14} {'accept length':>13} {'accept rate':>11} {'mismatches':>10}")
    for name in accept:
        print(
            f"{name:<14} {accept[name]:>13.3f} {details[name]['accept_rate']:>11.3f} "
            f"{mismatches[name]:>10}"
        )

    for name, value in by_eval.items():
        print(f"eagle3-datagen eval, {name} draft: accept length {value:.3f}")
    for r in summary.get("selection_table", []):
        print(
            f"select {r['rule']:<14} accept length {r['accept_length']:.3f}  "
            f"{r['train_rows']} rows  {r['steps']} steps  {r['seconds']} s  "
            f"mismatches {r['lossless_mismatches']}"
        )
    return summary


if __name__ == "__main__":
    main(*sys.argv[1:])
