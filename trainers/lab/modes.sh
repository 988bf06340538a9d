# Sourced by trainers/lab.sh: the modes table (issue #34, docs/modes-lab.md). Uses lab.sh's
# WORK, PORT, SPEC, SPEC_FLAGS, TARGET_STEPS, DRAFT_STEPS, MAX_NEW, SEEDS, SEED0, serve,
# stop_server, step, train, last_ckpt. Everything lands in $WORK/modes/.
#  1. A target that serves both of Kimi-K2.5's modes (make_target.py ... modes: each training
#     answer in thinking and in instant mode), from the same corpus as the main target.
#  2. Three generation runs of the lab prompts through the unchanged pipeline, one partition
#     `lab` each, differing only in `partitions[].modes`: thinking (1.0), instant (1.0) and the
#     declared mixture (thinking 0.5, instant 0.5). The held-out split is a hash of partition +
#     line id, so the three exports hold out the same prompts.
#  3. One draft on the thinking-only export and one on the mixture's per seed of SEEDS, the
#     same number of steps (the same compute: packed batches of the same size).
#  4. Each draft measured (measure.py, temperature 0) on the held-out prompts in each mode:
#     the prompts every export holds out (modes.py heldout), from the thinking export and from
#     the instant one: the same prompts rendered in the two modes; transformers generate's
#     outputs for the lossless check (and the plain server's); and
#     `eagle3-datagen eval` on the mixture dataset (its per-mode slices).
MODES=$WORK/modes
MIXES=(thinking instant mixture)
mkdir -p "$MODES"
step "modes: a target serving both modes ($TARGET_STEPS steps)"
"$SPEC" trainers/lab/make_target.py src/eagle3_datagen/assets/kimi-k2.5-mini \
  "$WORK/corpus/target_train.jsonl" "$MODES/target" "$TARGET_STEPS" modes > "$MODES/target.log"
tail -1 "$MODES/target.log"

step "modes: the lab prompts generated thinking-only, instant-only and as the mixture"
SERVE_TARGET=$MODES/target serve "$MODES/emulator-generate.log"
for mix in "${MIXES[@]}"; do
  uv run python trainers/lab/modes.py config "$WORK/lab.yaml" "$mix" "$MODES/$mix.yaml"
  uv run eagle3-datagen run "$MODES/$mix.yaml" --server-url "http://127.0.0.1:$PORT" \
    --output "$MODES/dataset-$mix" > "$MODES/run-$mix.log" 2>&1 \
    || { tail -30 "$MODES/run-$mix.log"; exit 1; }
  tail -2 "$MODES/run-$mix.log" | head -1
  uv run eagle3-datagen export "$MODES/dataset-$mix" --format speculators --validation 0.2 \
    --max-length 2048 --output "$MODES/export-$mix/speculators.jsonl" | tail -1
done
stop_server
uv run python trainers/lab/modes.py heldout "$MODES"

for seed in $SEEDS; do
  for data in thinking mixture; do
    step "modes: draft on the $data data, seed $seed ($DRAFT_STEPS steps)"
    SEED=$seed TRAIN_TARGET=$MODES/target train "mode-$data-seed$seed" "$MODES/export-$data" \
      "$DRAFT_STEPS" "$(wc -l < "$MODES/export-$data/speculators.jsonl")"
    mv "$WORK/selection/mode-$data-seed$seed.train.json" "$MODES/draft-$data-seed$seed.train.json"
  done
done

step "modes: references (transformers generate) and outputs without speculation, both modes"
SERVE_TARGET=$MODES/target serve "$MODES/emulator-plain.log"
for mode in thinking instant; do
  "$SPEC" trainers/lab/reference.py "$MODES/target" "$MODES/heldout-$mode.jsonl" "$MAX_NEW" \
    "$MODES/reference-$mode.json"
  uv run python trainers/lab/measure.py "http://127.0.0.1:$PORT" \
    "$MODES/heldout-$mode.jsonl" "$MAX_NEW" "$MODES/plain-$mode.json"
done
stop_server
for seed in $SEEDS; do
  for data in thinking mixture; do
    step "modes: held-out accept length in each mode, draft on the $data data, seed $seed"
    SERVE_TARGET=$MODES/target serve "$MODES/emulator-draft-$data-seed$seed.log" \
      "${SPEC_FLAGS[@]}" \
      --speculative-draft-model-path "$(last_ckpt "$WORK/drafts/mode-$data-seed$seed")"
    for mode in thinking instant; do
      uv run python trainers/lab/measure.py "http://127.0.0.1:$PORT" \
        "$MODES/heldout-$mode.jsonl" "$MAX_NEW" \
        "$MODES/draft-$data-seed$seed-on-$mode.json"
    done
    if [ "$seed" = "$SEED0" ]; then
      uv run eagle3-datagen eval "$MODES/dataset-mixture" --server-url "http://127.0.0.1:$PORT" \
        --validation 0.2 --min-records 10 --no-history --json "$MODES/eval-$data.json" \
        > "$MODES/eval-$data.log" || { tail -20 "$MODES/eval-$data.log"; exit 1; }
    fi
    stop_server
  done
done
uv run python trainers/lab/modes.py table "$MODES" "$SEEDS"
