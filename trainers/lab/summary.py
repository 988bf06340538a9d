"""The lab's table: held-out accept length per draft, and the verifier's honesty at temperature 0
(every held-out prompt's output ids with speculation equal those without).

usage: python summary.py OUT_JSON PLAIN_JSON NAME=MEASURE_JSON ...
"""

import json
import sys
from pathlib import Path


def main(out: str, plain: str, *named: str) -> None:
    base = json.loads(Path(plain).read_text())
    ids = {r["id"]: r["output_ids"] for r in base["outputs"]}
    accept, mismatches, details = {}, {}, {}
    for item in named:
        name, _, path = item.partition("=")
        run = json.loads(Path(path).read_text())
        accept[name] = run["accept_length"]
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
    Path(out).write_text(json.dumps(summary, indent=1))
    print(f"held-out prompts: {base['records']} (temperature 0)")
    print(f"{'draft':<14} {'accept length':>13} {'accept rate':>11} {'mismatches':>10}")
    for name in accept:
        print(
            f"{name:<14} {accept[name]:>13.3f} {details[name]['accept_rate']:>11.3f} "
            f"{mismatches[name]:>10}"
        )


if __name__ == "__main__":
    main(*sys.argv[1:])
