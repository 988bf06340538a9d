"""SpecForge 0.2.0 reading one of our specforge exports with its own code, recorded.

1. ``prepare_prompt_tasks`` (the loader behind ``data.prompts_path``) on the export's files at
   the export's max length: every row must come through with identical input_ids and
   loss_mask; rows it clips are counted (and at max length 512, to see clipping counted).
2. The target's features for each file (hidden_states.py), read back by SpecForge's own
   ``OfflineManifestReader`` and ``load_feature_file``, then its EAGLE-3 offline shift:
   ``normalize_offline_sample`` + ``TargetHead.preprocess`` (what ``specforge train`` runs on
   ``data.hidden_states_path`` / ``data.eval_hidden_states_path``), with the final hidden state
   replaced by position codes: which predictions each row trains.
Writes RECORD (JSON): per "<file>:<line>", the sha256 of input_ids, its length, whether it
loaded identical, and the trained prediction indices (index j: the teacher distribution of
token j, i.e. of position j-1), plus the same for the *old* convention (loss only on the
output), to show what the shift does with it.

usage: python specforge_check.py TARGET EXPORT_JSONL WORK_DIR RECORD
"""

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import torch
from specforge.algorithms.eagle3.data import normalize_offline_sample
from specforge.data.prompt_builder import prepare_prompt_tasks
from specforge.modeling.target.target_head import TargetHead
from specforge.runtime.data_plane.feature_store import load_feature_file
from specforge.runtime.data_plane.offline_reader import OfflineManifestReader

HERE = Path(__file__).resolve().parent
LOW_MAX = 512


def sha(ids: list[int]) -> str:
    return hashlib.sha256(json.dumps(ids).encode()).hexdigest()


def ranges(values: list[int]) -> list[list[int]]:
    out: list[list[int]] = []
    for v in sorted(values):
        if out and v == out[-1][1] + 1:
            out[-1][1] = v
        else:
            out.append([v, v])
    return out


def load(path: Path, max_length: int) -> list[dict]:
    tasks = prepare_prompt_tasks(
        path,
        None,
        chat_template=None,
        max_length=max_length,
        is_preformatted=False,
        train_only_last_turn=False,
        cache_dir=None,
        cache_key=None,
        num_proc=None,
    )
    return [t["payload"] for t in tasks]


def trained(raw: dict, max_len: int, head: TargetHead) -> list[list[int]]:
    """SpecForge's offline normalizer and target shift on position-coded final states."""
    raw = dict(raw)
    n = raw["input_ids"].shape[0]
    raw["hidden_state"] = torch.arange(1, n + 1, dtype=torch.float32).view(1, n, 1)
    sample = normalize_offline_sample(raw, max_len)
    _, target, loss_mask = head.preprocess(
        sample["input_ids"], sample["target"], sample["loss_mask"]
    )
    codes = target[0, :, 0]
    mask = loss_mask[0, :, 0].bool()
    # The draft's position t is taught by the target state of position t+1 (code t+2), whose
    # logits are the teacher distribution of token t+2: the code is the predicted index.
    return ranges([int(c) for c in codes[mask].tolist()])


def main(target: str, export: str, work: str, record: str) -> None:
    export_path, work_dir = Path(export), Path(work)
    meta = json.loads(export_path.with_name(f"{export_path.stem}.export.json").read_text())
    max_len = meta["options"]["max_length"]
    files = {"train": export_path}
    if meta["files"]["validation"]:
        files["validation"] = export_path.with_name(meta["files"]["validation"])
    head = TargetHead.__new__(TargetHead)  # preprocess reads no weights
    records, clipped, clipped_low, old = {}, 0, 0, {}
    for side, path in files.items():
        rows = [json.loads(x) for x in path.read_text().splitlines()]
        payloads = load(path, max_len)
        assert len(payloads) == len(rows), f"{path}: {len(rows)} rows, {len(payloads)} loaded"
        clipped_low += sum(
            len(p["input_ids"]) < len(r["input_ids"])
            for p, r in zip(load(path, LOW_MAX), rows, strict=True)
        )
        feats = work_dir / f"features-{side}"
        subprocess.run(
            [
                sys.executable,
                str(HERE / "hidden_states.py"),
                "specforge",
                target,
                str(path),
                str(feats),
            ],
            check=True,
        )
        refs = OfflineManifestReader(str(feats), max_len=max_len).read()
        assert len(refs) == len(rows), f"{feats}: {len(refs)} feature files"
        for line, (row, payload, ref) in enumerate(zip(rows, payloads, refs, strict=True), 1):
            raw = load_feature_file(ref.feature_store_uri.removeprefix("file://"))
            assert raw["input_ids"].tolist() == row["input_ids"], f"{path}:{line}: features"
            whole = payload == {"input_ids": row["input_ids"], "loss_mask": row["loss_mask"]}
            clipped += not whole
            records[f"{path.name}:{line}"] = {
                "sha256": sha(row["input_ids"]),
                "length": len(row["input_ids"]),
                "mask_sha256": sha(row["loss_mask"]),
                "loaded_identical": whole,
                "file": side,
                "trained": trained(raw, max_len, head),
            }
            output_only = raw["loss_mask"].clone()
            first = int(torch.nonzero(output_only)[0])
            output_only[first] = 0  # the export before: loss only on the output tokens
            old[f"{path.name}:{line}"] = trained({**raw, "loss_mask": output_only}, max_len, head)
    out = {
        "trainer": "specforge",
        "version": "0.2.0",
        "max_length": max_len,
        "clipped": clipped,
        "clipped_at_low_max": {"max_length": LOW_MAX, "rows": clipped_low},
        "records": records,
        "output_only_mask_trained": old,
    }
    Path(record).write_text(json.dumps(out, indent=1, sort_keys=True))
    print(
        f"SpecForge: {len(records)} rows loaded, {clipped} clipped at {max_len}, "
        f"{clipped_low} at {LOW_MAX}; record -> {record}"
    )


if __name__ == "__main__":
    main(*sys.argv[1:5])
