"""The lab's table: held-out accept length per draft, and the verifier's honesty at temperature 0
(every held-out prompt's output ids with speculation equal those without).

usage: python summary.py OUT_JSON PLAIN_JSON NAME=MEASURE_JSON ... [--selection DIR ROW ...]

Where ``eval-NAME.json`` lies beside NAME's measure file (``eagle3-datagen eval --json``, the
same held-out split, each record's own sampling), its accept length is ``accept_length_eval``.

With ``--selection``: the selection table (issue #35, docs/selection-lab.md), one row per name,
from DIR/ROW.json (measure.py's output) and DIR/ROW.train.json (steps, wall seconds, rows).
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


def main(out: str, plain: str, *args: str) -> None:
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
    Path(out).write_text(json.dumps(summary, indent=1))
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


if __name__ == "__main__":
    main(*sys.argv[1:])
