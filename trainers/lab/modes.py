"""The modes table's steps that are not shell (trainers/lab/modes.sh, docs/modes-lab.md).

modes.py config LAB_YAML MIX OUT_YAML   the lab's run config with Kimi-K2.5's two modes
                                        declared and partition ``lab`` as MIX: thinking,
                                        instant, or mixture (thinking 0.5, instant 0.5)
modes.py heldout DIR                    the prompts all three exports hold out (a line
                                        rejected in one mode is left out of every mode, and
                                        counted), as DIR/heldout-{thinking,instant}.jsonl;
                                        the records carry the modes their config asked for
modes.py table DIR                      DIR/table.json: accept length by draft and mode, the
                                        eval's mode slices, the lossless check
"""

import json
import sys
from pathlib import Path

import pyarrow.parquet as pq
import yaml

MODES = {"thinking": {}, "instant": {"thinking": False}}  # as docs/modes.md declares them
MIXES = {
    "thinking": {"thinking": 1.0},
    "instant": {"instant": 1.0},
    "mixture": {"thinking": 0.5, "instant": 0.5},
}
DRAFTS = {"thinking": "thinking_only", "mixture": "mixture"}  # data -> the table's row name


def config(lab_yaml: str, mix: str, out: str) -> None:
    data = yaml.safe_load(Path(lab_yaml).read_text())
    data["model"]["modes"] = MODES
    [partition] = data["partitions"]
    partition["modes"] = MIXES[mix]
    Path(out).write_text(yaml.safe_dump(data, sort_keys=False))


def _rows(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def _heldout(folder: Path, mix: str) -> list[dict]:
    return _rows(folder / f"export-{mix}" / "speculators.validation.jsonl")


def _record_modes(folder: Path, mix: str) -> dict[str, str]:
    shards = sorted((folder / f"dataset-{mix}" / "lab").glob("part-*.parquet"))
    table = pq.read_table(shards, columns=["id", "mode"])
    return dict(zip(table.column("id").to_pylist(), table.column("mode").to_pylist(), strict=True))


def heldout(folder: str) -> None:
    root = Path(folder)
    held = {mix: _heldout(root, mix) for mix in MIXES}
    common = set.intersection(*({r["id"] for r in rows} for rows in held.values()))
    everywhere = set.union(*({r["id"] for r in rows} for rows in held.values()))
    if len(common) < len(everywhere) / 2:
        raise SystemExit(f"the exports hold out different prompts: {len(common)} in common")
    for mode in MODES:
        rows = [r for r in held[mode] if r["id"] in common]
        (root / f"heldout-{mode}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    for mix, shares in MIXES.items():
        modes = _record_modes(root, mix)
        if set(modes.values()) != set(shares):
            raise SystemExit(f"dataset-{mix}: modes {sorted(set(modes.values()))}, not {shares}")
    mixed = _record_modes(root, "mixture")
    counts = {m: sum(v == m for v in mixed.values()) for m in MODES}
    left = len(everywhere) - len(common)
    print(
        f"held out: {len(common)} prompts in both modes ({left} held out by one export only, "
        f"left out: rejected in another); mixture records {counts}"
    )


def _mismatches(plain: dict, run: dict) -> int:
    ids = {r["id"]: r["output_ids"] for r in plain["outputs"]}
    return sum(ids.get(r["id"]) != r["output_ids"] for r in run["outputs"])


def table(folder: str) -> None:
    root = Path(folder)
    plain = {m: json.loads((root / f"plain-{m}.json").read_text()) for m in MODES}
    mixed = _record_modes(root, "mixture")
    by_mode, by_eval, rows, mismatches = {}, {}, [], 0
    for data, name in DRAFTS.items():
        train = json.loads((root / f"draft-{data}.train.json").read_text())
        rows_trained = _rows(root / f"export-{data}" / "speculators.jsonl")
        supervised = sum(sum(r["loss_mask"]) for r in rows_trained)
        row = {"draft": name, "trained_on": MIXES[data], **train, "train_tokens": supervised}
        row["accept_length"], row["accept_rate"], row["lossless_mismatches"] = {}, {}, {}
        for mode in MODES:
            run = json.loads((root / f"draft-{data}-on-{mode}.json").read_text())
            row["accept_length"][mode] = run["accept_length"]
            row["accept_rate"][mode] = run["summary"]["accept_rate"]
            row["lossless_mismatches"][mode] = _mismatches(plain[mode], run)
            mismatches += row["lossless_mismatches"][mode]
        evaluated = json.loads((root / f"eval-{data}.json").read_text())
        row["eval_mixture_by_mode"] = {
            mode: s["accept_length"] for mode, s in evaluated["slices"]["mode"].items()
        }
        by_mode[name] = row["accept_length"]
        by_eval[name] = row["eval_mixture_by_mode"]
        rows.append(row)
    result = {
        "heldout_prompts": {m: plain[m]["records"] for m in MODES},
        "mixture": MIXES["mixture"],
        "mixture_records": {m: sum(v == m for v in mixed.values()) for m in MODES},
        "accept_length_by_mode": by_mode,
        "accept_length_eval_by_mode": by_eval,
        "lossless_mismatches": mismatches,
        "modes_table": rows,
    }
    (root / "table.json").write_text(json.dumps(result, indent=1))
    print(f"{'draft':<14} {'on thinking':>11} {'on instant':>10}  rows  tokens  steps  mismatches")
    for row in rows:
        a = row["accept_length"]
        print(
            f"{row['draft']:<14} {a['thinking']:>11.3f} {a['instant']:>10.3f}  "
            f"{row['train_rows']:>4}  {row['train_tokens']:>6}  {row['steps']:>5}  "
            f"{sum(row['lossless_mismatches'].values())}"
        )


if __name__ == "__main__":
    command, *args = sys.argv[1:]
    {"config": config, "heldout": heldout, "table": table}[command](*args)
