# Sourced by trainers/lab.sh after its drafts are measured: the selection table (issue #35,
# docs/selection-lab.md). Uses lab.sh's WORK, PORT, SPEC_FLAGS, HELDOUT, DRAFT_STEPS, MAX_NEW,
# SEEDS, SEED0, serve, stop_server, step, train, last_ckpt.
#  1. The incumbent draft is the one trained on the ORIGINAL answers (what one had before
#     regenerating). The lab prompts are generated again with the emulator speculating with it
#     and `logprobs: {top_k: 8}` on: every record gets the spec_* columns and the target's
#     logprobs. Lossless at temperature 0, so the output ids must equal the plain run's
#     (checked); only the columns are new. LAB_SCORE_DRAFT=none scores without a draft (a
#     plain run, logprobs only: cheaper, since every verify step also runs the draft):
#     `deviation` then ranks by p(sampled) and `acceptance` has nothing to read, so the rules
#     default to flatness, deviation and random.
#  2. `eagle3-datagen select --keep K --seed S` by each rule (LAB_SELECTION_RULES), for each
#     keep fraction K (LAB_SELECTION_KEEPS, default 0.5) and seed S of SEEDS (the draft trains
#     with the same seed: initialisation and batch order; random's subset moves with it too);
#     each exported with the same --validation 0.2 (a conversation's side is a hash
#     of its key, so a selection's training rows are full training rows: checked).
#  3. One draft per selection for the same number of epochs as the full-data draft (steps in
#     proportion to training tokens), measured on the FULL export's held-out prompts.
#     LAB_SELECTION_BUDGET=compute gives every row the same steps instead (DRAFT_STEPS x KEEP:
#     a rule that keeps longer conversations would otherwise train longer than random); its
#     rows are named RULE[@KEEP]+compute and compared with random+compute.
#     LAB_SELECTION_BUDGET=full gives every row the full-data draft's DRAFT_STEPS (rows
#     RULE[@KEEP]+full): random+full against the full draft says whether the data is redundant
#     at that compute (half of it, trained as long, as good as all of it: the data-rich regime),
#     and each rule against random+full whether choosing the half by rule beats drawing it.
RULES=${LAB_SELECTION_RULES:-flatness deviation acceptance random}
if [ "${LAB_SCORE_DRAFT:-original}" = none ]; then
  RULES=${LAB_SELECTION_RULES:-flatness deviation random}
  step "scored run: the prompts again, no draft (LAB_SCORE_DRAFT=none), logprobs top 8"
  SCORE_FLAGS=()
else
  step "scored run: the prompts again, speculating with the original draft, logprobs top 8"
  SCORE_FLAGS=("${SPEC_FLAGS[@]}" --speculative-draft-model-path
    "$(last_ckpt "$WORK/drafts/original-seed$SEED0")")
fi
if ! done_before "$WORK/dataset-scored/manifest.json"; then
  rm -rf "$WORK/dataset-scored"
  serve "$WORK/emulator-scored.log" "${SCORE_FLAGS[@]}"
  sed 's#tier: LAB}#tier: LAB, logprobs: {top_k: 8}}#' "$WORK/lab.yaml" > "$WORK/lab-scored.yaml"
  uv run eagle3-datagen run "$WORK/lab-scored.yaml" --server-url "http://127.0.0.1:$PORT" \
    --output "$WORK/dataset-scored" > "$WORK/run-scored.log" 2>&1 \
    || { tail -30 "$WORK/run-scored.log"; exit 1; }
  stop_server
fi
uv run python trainers/lab/selection.py same-ids "$WORK/dataset" "$WORK/dataset-scored"
# The same prompts: the same held-out split (select never ranks it; each selection keeps it).
cp "$WORK/dataset/split.json" "$WORK/dataset-scored/split.json"

for keep in ${LAB_SELECTION_KEEPS:-0.5}; do
  for rule in $RULES; do
    row=$rule
    [ "$keep" = 0.5 ] || row=$rule@$keep
    same_compute=
    case ${LAB_SELECTION_BUDGET:-epochs} in
      compute) row=$row+compute same_compute=$keep ;;
      full) row=$row+full same_compute=1 ;;
    esac
    for seed in $SEEDS; do
      name=$row-seed$seed dir=sel-${row/@/-keep}-seed$seed
      done_before "$WORK/selection/$name.json" && continue
      step "selection $name: --by $rule --keep $keep --seed $seed, draft seed $seed"
      uv run eagle3-datagen select "$WORK/dataset-scored" --by "$rule" --keep "$keep" \
        --seed "$seed" --output "$WORK/select/$dir" | tail -2
      uv run eagle3-datagen export "$WORK/select/$dir" --format speculators --validation 0.2 \
        --max-length 2048 --output "$WORK/$dir/speculators.jsonl" | tail -1
      steps=$(uv run python trainers/lab/selection.py steps "$WORK/regenerated" "$WORK/$dir" \
        "$DRAFT_STEPS" $same_compute | tail -1)
      SEED=$seed train "$dir" "$WORK/$dir" "$steps" "$(wc -l < "$WORK/$dir/speculators.jsonl")"
      mv "$WORK/selection/$dir.train.json" "$WORK/selection/$name.train.json"
      serve "$WORK/emulator-$dir.log" "${SPEC_FLAGS[@]}" \
        --speculative-draft-model-path "$(last_ckpt "$WORK/drafts/$dir")"
      uv run python trainers/lab/measure.py "http://127.0.0.1:$PORT" "$HELDOUT" "$MAX_NEW" \
        "$WORK/selection/$name.json"
      stop_server
    done
  done
done
cp "$WORK/selection/regenerated-seed$SEED0.train.json" "$WORK/selection/full.train.json"
