#!/usr/bin/env bash
# The conformance harness in one command: set up .venv-conformance if needed, then run
# tests/conformance against SGLang 0.5.23's real HTTP app. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${CONFORMANCE_VENV:-.venv-conformance}
if ! "$VENV/bin/python" -c "import sglang, vllm" 2>/dev/null; then
  conformance/setup.sh
fi
# One process (-o addopts: not pyproject's `-n 2`; this environment has no pytest-xdist, and the
# cases start SGLang's app one at a time).
exec "$VENV/bin/python" -m pytest tests/conformance -m conformance -p no:cacheprovider \
  -o addopts=--durations=30 "$@"
