# Sourced by trainers/lab.sh after its drafts are measured: the selection table (issue #35,
# docs/selection-lab.md). Uses lab.sh's WORK, PORT, SPEC_FLAGS, HELDOUT, DRAFT_STEPS, MAX_NEW,
# serve, stop_server, step, train, last_ckpt; sets SELECTION_ROWS.
#  1. The incumbent draft is the one trained on the ORIGINAL answers (what one had before
#     regenerating). The lab prompts are generated again with the emulator speculating with it
#     and `logprobs: {top_k: 8}` on: every record gets the spec_* columns and the target's
#     logprobs. Lossless at temperature 0, so the output ids must equal the plain run's
#     (checked); only the columns are new.
#  2. `eagle3-datagen select --keep 0.5 --seed 0` by each rule, and a second random seed for
#     the noise; each exported with the same --validation 0.2 (a conversation's side is a hash
#     of its key, so a selection's training rows are full training rows: checked).
#  3. One draft per selection for the same number of epochs as the full-data draft (steps in
#     proportion to training tokens), measured on the FULL export's held-out prompts.
step "scored run: the prompts again, speculating with the original draft, logprobs top 8"
serve "$WORK/emulator-scored.log" "${SPEC_FLAGS[@]}" \
  --speculative-draft-model-path "$(last_ckpt "$WORK/drafts/original")"
sed 's#tier: LAB}#tier: LAB, logprobs: {top_k: 8}}#' "$WORK/lab.yaml" > "$WORK/lab-scored.yaml"
uv run eagle3-datagen run "$WORK/lab-scored.yaml" --server-url "http://127.0.0.1:$PORT" \
  --output "$WORK/dataset-scored" > "$WORK/run-scored.log" 2>&1 \
  || { tail -30 "$WORK/run-scored.log"; exit 1; }
stop_server
uv run python trainers/lab/selection.py same-ids "$WORK/dataset" "$WORK/dataset-scored"
# The same prompts: the same held-out split (select never ranks it; each selection keeps it).
cp "$WORK/dataset/split.json" "$WORK/dataset-scored/split.json"

SELECTION_ROWS=full
ln -sf "$WORK/measure-regenerated.json" "$WORK/selection/full.json"
for row in ${LAB_SELECTION_ROWS:-flatness:0 deviation:0 acceptance:0 random:0 random:1}; do
  rule=${row%:*} seed=${row#*:} name=${row%:0}
  name=${name/:/-seed}
  step "selection $name: --by $rule --keep 0.5 --seed $seed"
  uv run eagle3-datagen select "$WORK/dataset-scored" --by "$rule" --keep 0.5 --seed "$seed" \
    --output "$WORK/select/$name" | tail -2
  uv run eagle3-datagen export "$WORK/select/$name" --format speculators --validation 0.2 \
    --max-length 2048 --output "$WORK/sel-$name/speculators.jsonl" | tail -1
  steps=$(uv run python trainers/lab/selection.py steps "$WORK/regenerated" "$WORK/sel-$name" \
    "$DRAFT_STEPS" | tail -1)
  train "sel-$name" "$WORK/sel-$name" "$steps" "$(wc -l < "$WORK/sel-$name/speculators.jsonl")"
  mv "$WORK/selection/sel-$name.train.json" "$WORK/selection/$name.train.json"
  serve "$WORK/emulator-sel-$name.log" "${SPEC_FLAGS[@]}" \
    --speculative-draft-model-path "$(last_ckpt "$WORK/drafts/sel-$name")"
  uv run python trainers/lab/measure.py "http://127.0.0.1:$PORT" "$HELDOUT" "$MAX_NEW" \
    "$WORK/selection/$name.json"
  stop_server
  SELECTION_ROWS="$SELECTION_ROWS $name"
done
mv "$WORK/selection/regenerated.train.json" "$WORK/selection/full.train.json"
