"""The lab's honesty gates over its summary (what CI fails on, .ci/run):

- ``lossless_mismatches == 0``: every speculating run's output ids at temperature 0 equal
  transformers' own ``generate`` on the target (trainers/lab/reference.py);
- ``accept_length.untrained < 1.1``: a draft that learned nothing accepts about nothing, so an
  accept length comes from what a draft learned, not from the verifier.

Not a gate: the gap between the drafts (a small lab's held-out set is too small to gate on).

usage: python gates.py SUMMARY_JSON      (exit 1 with one line per failed gate)
"""

import json
import sys
from pathlib import Path

UNTRAINED_BELOW = 1.1


def failures(summary: dict) -> list[str]:
    out = []
    lost = summary.get("lossless_mismatches")
    if lost != 0:
        by = summary.get("lossless_mismatches_by_draft", {})
        out.append(
            f"lossless_mismatches is {lost}, not 0: speculation changed output ids at "
            f"temperature 0 against transformers generate (by draft: {by}, plain server: "
            f"{summary.get('lossless_mismatches_plain')})"
        )
    untrained = summary.get("accept_length", {}).get("untrained")
    if untrained is None:
        out.append("accept_length.untrained is missing: the untrained draft was not measured")
    elif not untrained < UNTRAINED_BELOW:
        out.append(
            f"accept_length.untrained is {untrained:.3f}, not below {UNTRAINED_BELOW}: a draft "
            "that learned nothing is accepted, so the accept lengths do not measure drafts"
        )
    return out


def main(path: str) -> None:
    try:
        summary = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise SystemExit(f"lab gates: {path}: {e}") from None
    failed = failures(summary)
    for line in failed:
        print(f"lab gate FAILED: {path}: {line}")
    if failed:
        raise SystemExit(1)
    print(
        f"lab gates passed: lossless_mismatches 0, accept_length.untrained "
        f"{summary['accept_length']['untrained']:.3f} < {UNTRAINED_BELOW}"
    )


if __name__ == "__main__":
    main(sys.argv[1])
