"""The modes table's steps that are not shell (trainers/lab/modes.sh, docs/modes-lab.md).

modes.py config LAB_YAML MIX OUT_YAML   the lab's run config with Kimi-K2.5's two modes
                                        declared and partition ``lab`` as MIX: thinking,
                                        instant, or mixture (thinking 0.5, instant 0.5)
modes.py heldout DIR                    the prompts all three exports hold out (a line
                                        rejected in one mode is left out of every mode, and
                                        counted), as DIR/heldout-{thinking,instant}.jsonl;
                                        the records carry the modes their config asked for
modes.py table DIR [SEEDS]              DIR/table.json: accept length by draft and mode (mean
                                        ± sd over SEEDS, default "0", with intervals), the
                                        mixture's difference per mode, the eval's mode slices,
                                        the lossless check against transformers generate
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


def table(folder: str, seeds_text: str = "0") -> None:
    from summary import difference, mismatches, spread  # trainers/lab/summary.py

    root, seeds = Path(folder), seeds_text.split()
    plain = {m: json.loads((root / f"plain-{m}.json").read_text()) for m in MODES}
    reference = {m: json.loads((root / f"reference-{m}.json").read_text()) for m in MODES}
    mixed = _record_modes(root, "mixture")
    by_mode, by_eval, rows, lost, runs = {}, {}, [], 0, {}
    for data, name in DRAFTS.items():
        train = json.loads((root / f"draft-{data}-seed{seeds[0]}.train.json").read_text())
        rows_trained = _rows(root / f"export-{data}" / "speculators.jsonl")
        supervised = sum(sum(r["loss_mask"]) for r in rows_trained)
        row = {"draft": name, "trained_on": MIXES[data], **train, "train_tokens": supervised}
        row["accept_length"], row["accept_length_seeds"] = {}, {}
        row["accept_rate"], row["lossless_mismatches"] = {}, {}
        for mode in MODES:
            rs = [
                json.loads((root / f"draft-{data}-seed{s}-on-{mode}.json").read_text())
                for s in seeds
            ]
            runs[name, mode] = rs
            row["accept_length_seeds"][mode] = spread(rs)
            row["accept_length"][mode] = row["accept_length_seeds"][mode]["mean"]
            row["accept_rate"][mode] = rs[0]["summary"]["accept_rate"]
            row["lossless_mismatches"][mode] = mismatches(reference[mode], rs)
            lost += row["lossless_mismatches"][mode]
        evaluated = json.loads((root / f"eval-{data}.json").read_text())
        row["eval_mixture_by_mode"] = {
            mode: s["accept_length"] for mode, s in evaluated["slices"]["mode"].items()
        }
        by_mode[name] = row["accept_length"]
        by_eval[name] = row["eval_mixture_by_mode"]
        rows.append(row)
    plain_lost = sum(mismatches(reference[m], [plain[m]]) for m in MODES)
    result = {
        "heldout_prompts": {m: plain[m]["records"] for m in MODES},
        "seeds": [int(s) for s in seeds],
        "mixture": MIXES["mixture"],
        "mixture_records": {m: sum(v == m for v in mixed.values()) for m in MODES},
        "accept_length_by_mode": by_mode,
        "accept_length_eval_by_mode": by_eval,
        "difference_mixture_minus_thinking_only": {
            m: difference(runs["mixture", m], runs["thinking_only", m]) for m in MODES
        },
        "lossless_reference": "transformers generate (greedy), trainers/lab/reference.py",
        "lossless_mismatches": lost + plain_lost,
        "lossless_mismatches_plain": plain_lost,
        "modes_table": rows,
    }
    (root / "table.json").write_text(json.dumps(result, indent=1))
    print(f"modes: {len(seeds)} seeds, mean ± sd [95 % CI]")
    print(f"{'draft':<14} {'on thinking':<30} {'on instant':<30} rows  tokens  steps  mism.")
    for row in rows:
        a = row["accept_length_seeds"]
        print(
            f"{row['draft']:<14} {_text(a['thinking']):<30} {_text(a['instant']):<30} "
            f"{row['train_rows']:>4}  {row['train_tokens']:>6}  {row['steps']:>5}  "
            f"{sum(row['lossless_mismatches'].values())}"
        )
    for mode, d in result["difference_mixture_minus_thinking_only"].items():
        print(f"mixture - thinking only, on {mode}: {_diff_text(d)}")


def _text(s: dict) -> str:
    return f"{s['mean']:.3f} ± {s['sd']:.3f} [{s['ci95'][0]:.3f}, {s['ci95'][1]:.3f}]"


def _diff_text(d: dict | None) -> str:
    if d is None:
        return "-"
    return f"{d['mean']:+.3f} [{d['ci95'][0]:+.3f}, {d['ci95'][1]:+.3f}] {d['verdict']}"


if __name__ == "__main__":
    command, *args = sys.argv[1:]
    {"config": config, "heldout": heldout, "table": table}[command](*args)
