"""The lab's selection table (issue #35): checks and the step budget around each selected draft.

  same-ids PLAIN_DATASET SCORED_DATASET   the scored run (speculating with the incumbent draft,
                                          logprobs on) made exactly the plain run's output ids
  steps FULL_EXPORT SELECTED_EXPORT FULL_STEPS [KEEP]
                                          the selected draft's steps for the SAME number of
                                          epochs (steps scale with training tokens), after
                                          checking no training row is a held-out row of the full
                                          export (all rows are measured on that held-out set);
                                          with KEEP, the same compute for every rule instead:
                                          FULL_STEPS x KEEP (a random KEEP subset's expected
                                          steps), so a rule that keeps longer conversations
                                          gets no more training than random (KEEP 1:
                                          the full draft's steps, LAB_SELECTION_BUDGET=full)

Runs with the project's environment (pyarrow); prints one line, the last of which a shell reads.
"""

import json
import sys
from pathlib import Path

import pyarrow.parquet as pq


def _outputs(dataset: str) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for part in sorted(Path(dataset).glob("*/part-*.parquet")):
        table = pq.read_table(part, columns=["id", "output_ids"])
        ids, outputs = table.column("id").to_pylist(), table.column("output_ids").to_pylist()
        out.update(zip(ids, outputs, strict=True))
    return out


def same_ids(plain: str, scored: str) -> None:
    a, b = _outputs(plain), _outputs(scored)
    differ = sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))
    if not a or differ:
        raise SystemExit(f"{scored}: {len(differ)} of {len(a)} records differ from {plain}")
    print(f"same output ids: {len(a)} records")


def _rows(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def steps(full: str, selected: str, full_steps: str, keep: str = "") -> None:
    train = _rows(Path(full) / "speculators.jsonl")
    held = {r["id"] for r in _rows(Path(full) / "speculators.validation.jsonl")}
    chosen = _rows(Path(selected) / "speculators.jsonl")
    leaked = [r["id"] for r in chosen if r["id"] in held]
    if leaked:
        raise SystemExit(f"{selected}: {len(leaked)} training rows are held out: {leaked[:3]}")
    tokens = sum(len(r["input_ids"]) for r in chosen)
    full_tokens = sum(len(r["input_ids"]) for r in train)
    n = max(1, round(int(full_steps) * tokens / full_tokens))
    budget = "same epochs"
    if keep:
        n, budget = max(1, round(int(full_steps) * float(keep))), f"same compute as keep {keep}"
        if float(keep) == 1:
            budget = "the full draft's compute"
    print(f"{len(chosen)} rows, {tokens} of {full_tokens} training tokens: {n} steps ({budget})")
    print(n)


if __name__ == "__main__":
    {"same-ids": same_ids, "steps": steps}[sys.argv[1]](*sys.argv[2:])
