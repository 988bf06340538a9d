#!/usr/bin/env bash
# One EAGLE-3 draft from one speculators export, with speculators' own code on CPU (the harness's
# path: prepare-data per file, join train-first, hidden states of the target, speculators_cpu.py).
#   trainers/lab/train_draft.sh TARGET EXPORT_DIR OUT_DIR STEPS   (SEED: the trainer's --seed, 0)
# SEED sets speculators' seed: the draft's initialisation and the order of its packed batches.
# The budget is a number of optimizer steps (--max-steps, and the LR schedule spans exactly
# that many), so drafts trained on different data get the same training. speculators keeps
# running (empty) epochs after --max-steps, so --epochs is set just above what the budget needs. Packed batches of 512 tokens (rows are
# shorter): speculators' dense sdpa masks grow with the square of --total-seq-len.
set -euo pipefail
TARGET=$(cd "$1" && pwd) EXPORT=$2 OUT=$3 STEPS=$4
SPEC=${SPEC:-$PWD/.venv-trainers-speculators/bin/python}
rm -rf "$OUT" && mkdir -p "$OUT"
# The prepared data and the target's hidden states depend on the export and the target only,
# not on the seed: made once per (export, target) in the export's folder, then reused by every
# seed's draft (each process start loads torch; on a loaded machine that is most of a draft).
PREP=$EXPORT/prep-$(echo "$TARGET" | sha256sum | cut -c1-12)
if [ ! -f "$PREP/.ready" ]; then
  rm -rf "$PREP" && mkdir -p "$PREP"
  for side in train validation; do
    file=$EXPORT/speculators.jsonl
    [ "$side" = validation ] && file=$EXPORT/speculators.validation.jsonl
    "$SPEC" -m speculators prepare-data --model "$TARGET" --data "$file" \
      --output "$PREP/prep-$side" --seq-length 2048 > "$PREP/prepare-$side.log" 2>&1
  done
  "$SPEC" trainers/speculators_join.py "$PREP/prep-train" "$PREP/prep-validation" \
    "$PREP/prep" | tail -1 | grep -oE '[0-9]+\.[0-9]+' | tail -1 > "$PREP/ratio"
  "$SPEC" trainers/hidden_states.py speculators "$TARGET" "$PREP/prep" > "$PREP/hidden.log" 2>&1
  touch "$PREP/.ready"
fi
RATIO=$(cat "$PREP/ratio")
# Epochs that cover STEPS: a packed batch holds at most 512 tokens, so an epoch has at least
# train_tokens / 512 steps.
EPOCHS=$(python3 -c 'import json, sys
tokens = sum(len(json.loads(x)["input_ids"]) for x in open(sys.argv[1]))
print(-(-int(sys.argv[2]) // max(1, tokens // 512)) + 1)' "$EXPORT/speculators.jsonl" "$STEPS")
"$SPEC" trainers/speculators_cpu.py --speculator-type eagle3 \
  --verifier-name-or-path "$TARGET" --data-path "$PREP/prep" \
  --train-data-ratio "$RATIO" --total-seq-len 512 --target-layer-ids 1 2 3 --num-layers 1 \
  --draft-arch llama --draft-attn-impl sdpa --loss-implementation eager \
  --hidden-states-dtype float32 --num-workers 0 --on-missing raise --epochs "$EPOCHS" --max-steps "$STEPS" \
  --scheduler-total-steps "$STEPS" --lr 3e-3 --seed "${SEED:-0}" --log-freq 10 \
  --save-path "$OUT/ckpt" > "$OUT/train.log" 2>&1 || { tail -30 "$OUT/train.log"; exit 1; }
echo "draft: $OUT/ckpt (train_data_ratio $RATIO, $STEPS steps)"
