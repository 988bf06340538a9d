#!/usr/bin/env bash
# EAGLE-3 drafts of the real target from one speculators export, one per seed, with
# speculators' own code on CPU (train_draft.sh's path: prepare-data per file, join train-first,
# the target's hidden states, speculators_cpu.py). The data is prepared once; each seed trains
# its own draft from it (--seed: the draft's initialisation and the data order).
#   trainers/lab/real_train.sh TARGET EXPORT_DIR OUT_DIR STEPS SEED...
# Drafts land in OUT_DIR/seed-S/ckpt/<last step>. Draft vocabulary LAB_DRAFT_VOCAB (pruned by
# token frequency in the training data, speculators' d2t mapping), target layers LAB_AUX_LAYERS.
# The optimizer is speculators' `--optimizer adamw`, not its default `muon`: torch's Muon runs its
# Newton-Schulz iterations in bfloat16, which this CPU (no bf16 instructions) multiplies about
# 90x slower than float32: 64 s of an 82 s step here, against 15 ms for AdamW.
# No validation epochs (LAB_SKIP_VALIDATION, speculators_cpu.py): they change no weight (a draft
# retrained without them was bitwise the same) and the lab measures each last checkpoint on the
# held-out prompts itself; on a quarter of the records they took ~40 % of a draft's time.
set -euo pipefail
export LAB_SKIP_VALIDATION=1
TARGET=$(cd "$1" && pwd) EXPORT=$2 OUT=$3 STEPS=$4
shift 4
SPEC=${SPEC:-$PWD/.venv-trainers-speculators/bin/python}
LAYERS=${LAB_AUX_LAYERS:-2 15 27}
VOCAB=${LAB_DRAFT_VOCAB:-8192}
rm -rf "$OUT" && mkdir -p "$OUT"
for side in train validation; do
  # prepare-data counts token frequencies only when told (--no-skip-token-freq; its default
  # skips them, and the trainer then falls back to the target's whole vocabulary without
  # failing): the training rows' counts pick the draft's LAB_DRAFT_VOCAB tokens.
  file=$EXPORT/speculators.jsonl freq=--no-skip-token-freq
  [ "$side" = validation ] && file=$EXPORT/speculators.validation.jsonl freq=--skip-token-freq
  "$SPEC" -m speculators prepare-data --model "$TARGET" --data "$file" $freq \
    --output "$OUT/prep-$side" --seq-length 2048 > "$OUT/prepare-$side.log" 2>&1 \
    || { tail -20 "$OUT/prepare-$side.log"; exit 1; }
done
RATIO=$("$SPEC" trainers/speculators_join.py "$OUT/prep-train" "$OUT/prep-validation" "$OUT/prep" \
  | tail -1 | grep -oE '[0-9]+\.[0-9]+' | tail -1)
EPOCHS=$(python3 -c 'import json, sys
tokens = sum(len(json.loads(x)["input_ids"]) for x in open(sys.argv[1]))
print(-(-int(sys.argv[2]) // max(1, tokens // 512)) + 1)' "$EXPORT/speculators.jsonl" "$STEPS")
LAB_AUX_LAYERS=$LAYERS "$SPEC" trainers/hidden_states.py speculators "$TARGET" "$OUT/prep" \
  > "$OUT/hidden.log" 2>&1 || { tail -20 "$OUT/hidden.log"; exit 1; }
for seed in "$@"; do
  "$SPEC" trainers/speculators_cpu.py --speculator-type eagle3 \
    --verifier-name-or-path "$TARGET" --data-path "$OUT/prep" \
    --train-data-ratio "$RATIO" --total-seq-len 512 --target-layer-ids $LAYERS --num-layers 1 \
    --draft-vocab-size "$VOCAB" \
    --draft-arch llama --draft-attn-impl sdpa --loss-implementation eager \
    --hidden-states-dtype float32 --num-workers 0 --on-missing raise --epochs "$EPOCHS" \
    --max-steps "$STEPS" --scheduler-total-steps "$STEPS" --lr 3e-3 --optimizer adamw --seed "$seed" \
    --log-freq 10 --save-path "$OUT/seed-$seed/ckpt" > "$OUT/train-$seed.log" 2>&1 \
    || { tail -30 "$OUT/train-$seed.log"; exit 1; }
  last=$(find "$OUT/seed-$seed/ckpt" -mindepth 1 -maxdepth 1 -type d -name '[0-9]*' | sort -V | tail -1)
  # speculators' trainer falls back to the target's whole vocabulary with only a warning when it
  # finds no token counts; a draft of another vocabulary than asked stops the lab here.
  python3 -c 'import json, sys
got = json.load(open(sys.argv[1] + "/config.json"))["draft_vocab_size"]
if got != int(sys.argv[2]):
    sys.exit(f"{sys.argv[1]}: draft vocabulary {got}, not LAB_DRAFT_VOCAB={sys.argv[2]}")' \
    "$last" "$VOCAB"
  # Only the last checkpoint's weights are measured: the earlier epochs' checkpoints and the
  # optimizer state (93 MB an epoch here) would fill a disk over a full run's ~50 drafts.
  find "$OUT/seed-$seed/ckpt" -mindepth 1 -maxdepth 1 ! -path "$last" -exec rm -rf {} +
  rm -f "$last"/optimizer_state_dict.pt "$last"/scheduler_state_dict.pt
done
rm -rf "$OUT/prep" "$OUT/prep-train" "$OUT/prep-validation"  # the prepared rows, hidden states
echo "drafts: $OUT/seed-{$(echo "$@" | tr ' ' ,)} (train_data_ratio $RATIO, $STEPS steps)"
