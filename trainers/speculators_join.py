"""Join two `speculators prepare-data` outputs, train rows first, for a validation split by
conversation.

speculators 0.9.0 has no validation path: `speculators train` holds out the rows after
``int(rows * --train-data-ratio)`` of the one prepared directory, and prepare-data shuffles
(and drops ``primary_id``), so the turns and samples of one conversation land on both sides.
Prepare the export's train and validation files separately, join them here, and train on the
joined directory with the printed ratio: its held-out rows are exactly the validation file's.
Run it with the speculators environment's python (it uses `datasets`, as speculators does).

usage: python speculators_join.py PREPARED_TRAIN PREPARED_VALIDATION OUT_DIR
"""

import shutil
import sys
from pathlib import Path

from datasets import concatenate_datasets, load_from_disk


def join(train_dir: str, val_dir: str, out_dir: str) -> float:
    train, val = load_from_disk(train_dir), load_from_disk(val_dir)
    if len(train) == 0 or len(val) == 0:
        raise SystemExit(f"nothing to split: {len(train)} train rows, {len(val)} validation rows")
    joined = concatenate_datasets([train, val])
    joined.save_to_disk(out_dir)
    freq = Path(train_dir) / "token_freq.pt"
    if freq.exists():  # token frequencies of the training rows only
        shutil.copy(freq, Path(out_dir) / "token_freq.pt")
    ratio = (len(train) + 0.5) / len(joined)
    assert int(len(joined) * ratio) == len(train)
    return ratio


if __name__ == "__main__":
    r = join(*sys.argv[1:4])
    print(f"joined -> {sys.argv[3]}; train with --train-data-ratio {r:.6f}")
