#!/usr/bin/env bash
# Make .venv-conformance: SGLang 0.5.23 (its HTTP app and its imports, torch CPU included) and
# this project, for tests/conformance. Not part of the default install or CI (~3 GB on disk).
# Elsewhere than the dev box (which has torch 2.13.0+cpu in its pip find-links), add
#   PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu
# so pip takes torch's CPU build instead of the ~3 GB CUDA one.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${CONFORMANCE_VENV:-.venv-conformance}
PY=${PYTHON:-python3.11}
if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV"
fi
"$VENV/bin/pip" install --quiet -r conformance/requirements.txt
# sglang's own requirement list pulls CUDA kernels (flashinfer, sgl-kernel, deep-gemm...) that a
# CPU box cannot load: install it alone, its load-time imports come from requirements.txt.
"$VENV/bin/pip" install --quiet --no-deps sglang==0.5.23
# vLLM stands in for the Kimi-K2.5 checkpoint's remote-code image processor
# (conformance/kimi_hf_processor.py); its own requirement list is a GPU serving stack.
"$VENV/bin/pip" install --quiet --no-deps vllm==0.33.0
"$VENV/bin/pip" install --quiet --no-deps -e .
"$VENV/bin/python" -c "
from conformance import stubs; stubs.install()
import sglang.srt.entrypoints.http_server, sglang, torch
print('conformance env ready: sglang', sglang.__version__, 'torch', torch.__version__)"
