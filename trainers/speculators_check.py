"""speculators 0.9.0 reading one of our speculators exports with its own code, recorded.

1. `speculators prepare-data` on the export's train (and validation) file: every row must come
   through with identical input_ids and loss_mask; rows it clips are counted.
2. With a validation file: the two prepared directories are joined (speculators_join.py) and
   speculators' own ArrowDataset splits them with the printed --train-data-ratio; each split
   must hold exactly the rows of its file.
3. speculators' own CollateFn + shift_batch (the EAGLE-3 preprocess of `speculators train`)
   on every row, with the verifier states replaced by position codes: which predictions each
   row trains after the shift.
Writes RECORD (JSON): per record id, its length, sha256 of input_ids, split and trained
prediction indices (index j: the teacher distribution of token j, i.e. of position j-1).

usage: python speculators_check.py TARGET EXPORT_JSONL WORK_DIR RECORD
"""

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import torch
from datasets import load_from_disk
from speculators.data_generation.preprocessing import _passthrough_pretokenized
from speculators.models.eagle3.data import shift_batch
from speculators.train.data import ArrowDataset, CollateFn

HERE = Path(__file__).resolve().parent
LOW_MAX = 512
sys.path.insert(0, str(HERE))
from speculators_join import join  # noqa: E402


def sha(ids: list[int]) -> str:
    return hashlib.sha256(json.dumps(ids).encode()).hexdigest()


def prepare(target: str, data: Path, out: Path, seq_length: int) -> None:
    subprocess.run(
        [
            sys.executable,
            "-m",
            "speculators",
            "prepare-data",
            "--model",
            target,
            "--data",
            str(data),
            "--output",
            str(out),
            "--seq-length",
            str(seq_length),
        ],
        check=True,
    )


def ranges(values: list[int]) -> list[list[int]]:
    """[[first, last], ...] of consecutive runs."""
    out: list[list[int]] = []
    for v in sorted(values):
        if out and v == out[-1][1] + 1:
            out[-1][1] = v
        else:
            out.append([v, v])
    return out


def trained(item: dict, total_seq_len: int) -> list[list[int]]:
    """Run speculators' collate with its eagle3 shift on one row with position-coded states."""
    n = item["input_ids"].shape[0]
    item = dict(item)
    code = torch.arange(1, n + 1, dtype=torch.float32)[:, None]  # position p -> p + 1
    item["verifier_last_hidden_states"] = code.expand(n, 4).clone()
    item["hidden_states"] = torch.zeros(n, 12)
    collate = CollateFn(
        total_seq_len, 4, num_target_layers=3, dtype=torch.float32, preprocess=shift_batch
    )
    batch = collate([item])
    mask = batch["loss_mask"][0].bool()
    codes = batch["verifier_last_hidden_states"][0, :, 0]
    # Position p's verifier state is the teacher of token p + 1 = its code.
    return ranges([int(c) for c in codes[mask].tolist()])


def read_export(export_path: Path) -> tuple[int, dict[str, Path], dict[str, list], dict]:
    """The export's max_length, its files by side, their rows, and the rows by input_ids."""
    meta = json.loads(export_path.with_name(f"{export_path.stem}.export.json").read_text())
    seq_len = meta["options"]["max_length"]
    files = {"train": export_path}
    if meta["files"]["validation"]:
        files["validation"] = export_path.with_name(meta["files"]["validation"])
    rows = {side: [json.loads(x) for x in p.read_text().splitlines()] for side, p in files.items()}
    by_ids: dict = {}
    for side, side_rows in rows.items():
        for r in side_rows:
            by_ids.setdefault(tuple(r["input_ids"]), []).append((r["id"], side, r))
    return seq_len, files, rows, by_ids


def check_prepare_data(
    target: str, files: dict[str, Path], work_dir: Path, seq_len: int, by_ids: dict
) -> tuple[dict, dict[str, str], int]:
    """1. prepare-data on each file, read back with its own loader: every row that comes back
    whole has the export's ids and loss_mask. Returns the prepared datasets, the side each
    record was loaded from, and how many rows came back clipped."""
    prepared = {}
    for side, path in files.items():
        prepare(target, path, work_dir / f"prep-{side}", seq_len)
        prepared[side] = load_from_disk(str(work_dir / f"prep-{side}"))
    loaded: dict[str, str] = {}
    clipped = 0
    for side, ds in prepared.items():
        for row in ds:
            ids = [int(t) for t in row["input_ids"]]
            # Rows can repeat each other's ids exactly: take one of this file's first.
            matches = sorted(
                (m for m in by_ids.get(tuple(ids), []) if m[0] not in loaded),
                key=lambda m: m[1] != side,
            )
            if not matches:  # clipped rows no longer match a whole export row
                clipped += 1
                continue
            rid, rside, src = matches[0]
            assert rside == side, f"{rid}: prepared from the {side} file, exported to {rside}"
            assert [int(t) for t in row["loss_mask"]] == src["loss_mask"], f"{rid}: loss_mask"
            loaded[rid] = side
    return prepared, loaded, clipped


def clipped_at_low_max(every: list[dict]) -> int:
    """prepare-data's own pass-through at a low maximum, to see its clipping counted."""
    low = _passthrough_pretokenized(
        {
            "input_ids": [r["input_ids"] for r in every],
            "loss_mask": [r["loss_mask"] for r in every],
        },
        LOW_MAX,
    )
    clipped_low, k = 0, 0
    for r in every:  # kept rows come back in order; a dropped row lost all its supervision
        kept = k < len(low["seq_len"]) and low["input_ids"][k].tolist() == r["input_ids"][:LOW_MAX]
        clipped_low += not kept or int(low["seq_len"][k]) < len(r["input_ids"])
        k += kept
    return clipped_low


def split_and_shift(
    target: str, files: dict[str, Path], work_dir: Path, seq_len: int, by_ids: dict
) -> tuple[float, dict[str, str], dict[str, list[list[int]]]]:
    """2. and 3. One directory for `speculators train`, split by its own ArrowDataset; each row's
    trained predictions after the shift. Returns the train ratio, each record's split and its
    trained prediction ranges."""
    data_dir = work_dir / "prep"
    if "validation" in files:
        ratio = join(str(work_dir / "prep-train"), str(work_dir / "prep-validation"), str(data_dir))
    else:
        ratio = 0.9
        load_from_disk(str(work_dir / "prep-train")).save_to_disk(str(data_dir))
    subprocess.run(
        [sys.executable, str(HERE / "hidden_states.py"), "speculators", target, str(data_dir)],
        check=True,
    )
    split_of: dict[str, str] = {}
    shifted: dict[str, list[list[int]]] = {}
    for side, name in (("train", "train"), ("validation", "val")):
        ds = ArrowDataset(
            max_len=seq_len,
            datapath=str(data_dir),
            on_missing="raise",
            train_ratio=ratio,
            split=name,
            hidden_states_dtype=torch.float32,
        )
        for i in range(len(ds)):
            item = ds[i]
            ids = [int(t) for t in item["input_ids"]]
            candidates = [m for m in by_ids.get(tuple(ids), []) if m[0] not in split_of]
            candidates.sort(key=lambda m: m[1] != side)
            match = candidates[0] if candidates else None
            if match is None:
                continue  # a clipped row: counted above
            split_of[match[0]] = side
            shifted[match[0]] = trained(item, seq_len)
    return ratio, split_of, shifted


def main(target: str, export: str, work: str, record: str) -> None:
    export_path, work_dir = Path(export), Path(work)
    seq_len, files, rows, by_ids = read_export(export_path)
    prepared, loaded, clipped = check_prepare_data(target, files, work_dir, seq_len, by_ids)
    n_export = sum(len(v) for v in rows.values())
    print(f"prepare-data: {len(loaded)} of {n_export} rows identical, {clipped} clipped")
    clipped_low = clipped_at_low_max([r for side_rows in rows.values() for r in side_rows])
    ratio, split_of, shifted = split_and_shift(target, files, work_dir, seq_len, by_ids)
    out = {
        "trainer": "speculators",
        "version": "0.9.0",
        "max_length": seq_len,
        "train_data_ratio": ratio,
        "export_records": n_export,
        "clipped": clipped,
        "clipped_at_low_max": {"max_length": LOW_MAX, "rows": clipped_low},
        "prepared_columns": sorted(prepared["train"].column_names),
        "records": {
            rid: {
                "length": len(src["input_ids"]),
                "sha256": sha(src["input_ids"]),
                "mask_sha256": sha(src["loss_mask"]),
                "exported_to": side,
                "loaded_from": loaded.get(rid),
                "split": split_of.get(rid),
                "trained": shifted.get(rid),
            }
            for side, side_rows in rows.items()
            for src in side_rows
            for rid in [src["id"]]
        },
    }
    Path(record).write_text(json.dumps(out, indent=1, sort_keys=True))
    print(f"speculators record -> {record} (train_data_ratio {ratio:.6f})")


if __name__ == "__main__":
    main(*sys.argv[1:5])
