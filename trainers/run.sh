#!/usr/bin/env bash
# The trainer harness in one command: speculators 0.9.0 and SpecForge 0.2.0 read this project's
# exports with their own code, on CPU, and train a one-layer EAGLE-3 draft on them.
#   trainers/run.sh            build the venvs if needed, run everything, assert
#   trainers/run.sh --record   ... and copy what the trainers' code produced to
#                              tests/fixtures/trainers/ (checked in CI without torch)
# Steps: the demo dataset (`eagle3-datagen demo`) and a grouped one (trainers/grouped.yaml:
# two samples per line, every turn regenerated, a LONG tier cut short so records truncate);
# both exports of each (validation split by conversation); a tiny random target (the only
# stand-in) and its hidden states from transformers; each trainer's own loader, split and
# EAGLE-3 shift (speculators_check.py, specforge_check.py); >= 30 training steps each
# (speculators_cpu.py, specforge_train.py + specforge_cpu.py: the two CPU patches); then
# tests/unit/test_trainer_conventions.py against what was just recorded, and losses.py.
# The demo's image records (demo_images) are recorded with its dataset but left out of both
# exports by design (docs/exports.md); the test checks no trainer saw them.
# Everything lands in trainers/work/ (git-ignored; TRAINERS_WORK to move it).
set -euo pipefail
cd "$(dirname "$0")/.."
RECORD=0
[ "${1:-}" = "--record" ] && RECORD=1
WORK=${TRAINERS_WORK:-trainers/work}
SPEC=$PWD/.venv-trainers-speculators/bin/python
SF=$PWD/.venv-trainers-specforge/bin/python
# One thread per process: on a shared CPU, torch's default (all cores, spinning) is ~3x slower.
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} TORCHDYNAMO_DISABLE=1 COLUMNS=400
export TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1
step() { echo; echo "== $(date -u +%H:%M:%S) $*"; }

step "trainer environments"
trainers/setup.sh
rm -rf "$WORK" && mkdir -p "$WORK" && WORK=$(cd "$WORK" && pwd)

step "datasets"
uv run eagle3-datagen demo --output "$WORK/demo/dataset"
uv run eagle3-datagen run trainers/grouped.yaml --output "$WORK/grouped/dataset"

step "tiny random target"
"$SPEC" trainers/make_target.py src/eagle3_datagen/assets/kimi-k2.5-mini "$WORK/target"

for ds in demo grouped; do
  D=$WORK/$ds
  step "$ds: exports"
  uv run eagle3-datagen export "$D/dataset" --format speculators --validation 0.2 \
    --max-length 2048 --output "$D/speculators/speculators.jsonl"
  uv run eagle3-datagen export "$D/dataset" --format specforge --validation 0.2 \
    --output "$D/specforge/specforge.jsonl"
  step "$ds: speculators' own prepare-data, split and shift"
  "$SPEC" trainers/speculators_check.py "$WORK/target" "$D/speculators/speculators.jsonl" \
    "$D/speculators" "$D/speculators.json"
  step "$ds: SpecForge's own prompt loader, feature reader and shift"
  "$SF" trainers/specforge_check.py "$WORK/target" "$D/specforge/specforge.jsonl" \
    "$D/specforge" "$D/specforge.json"
done

step "speculators train (one-layer EAGLE-3, 3 epochs) on the demo export"
RATIO=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["train_data_ratio"])' \
  "$WORK/demo/speculators.json")
"$SPEC" trainers/speculators_cpu.py --speculator-type eagle3 \
  --verifier-name-or-path "$WORK/target" --data-path "$WORK/demo/speculators/prep" \
  --train-data-ratio "$RATIO" --total-seq-len 2048 --target-layer-ids 1 2 3 --num-layers 1 \
  --draft-arch llama --draft-attn-impl sdpa --loss-implementation eager \
  --hidden-states-dtype float32 --num-workers 0 --on-missing raise --epochs 3 --log-freq 1 \
  --save-path "$WORK/demo/speculators-ckpt" > "$WORK/demo/speculators-train.log" 2>&1 \
  || { tail -40 "$WORK/demo/speculators-train.log"; exit 1; }

step "specforge train (one-layer EAGLE-3, offline features) on the demo export"
"$SF" trainers/specforge_train.py "$WORK/target" "$WORK/demo/specforge/features-train" \
  "$WORK/demo/specforge/features-validation" 2048 "$WORK/demo/specforge-train" > /dev/null

step "losses"
python3 trainers/losses.py "$WORK/demo/speculators-train.log" \
  "$WORK/demo/specforge-train/train.log" "$WORK/training.json"

step "recorded trainer outputs against the exports"
F=$WORK/fixtures
for ds in demo grouped; do
  D=$WORK/$ds
  mkdir -p "$F/$ds"
  (cd "$D/dataset" && find . -name manifest.json -o -path './*/part-*.parquet' \
     -o -path './*/_batches/*.json' | grep -v /rejects/ | while read -r f; do
       mkdir -p "$F/$ds/dataset/$(dirname "$f")" && cp "$f" "$F/$ds/dataset/$f"; done)
  cp "$D/speculators.json" "$D/specforge.json" "$F/$ds/"
  cp "$D/speculators/speculators.export.json" "$D/specforge/specforge.export.json" "$F/$ds/"
done
cp "$WORK/training.json" "$F/"
TRAINER_FIXTURES=$F uv run pytest tests/unit/test_trainer_conventions.py -q -p no:cacheprovider

if [ "$RECORD" = 1 ]; then
  step "recording to tests/fixtures/trainers/"
  rm -rf tests/fixtures/trainers/demo tests/fixtures/trainers/grouped
  mkdir -p tests/fixtures/trainers && cp -r "$F"/* tests/fixtures/trainers/
fi
step "harness passed"
