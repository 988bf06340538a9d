#!/usr/bin/env bash
# The conformance harness in one command: set up .venv-conformance if needed, then run
# tests/conformance against SGLang 0.5.23's real HTTP app. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${CONFORMANCE_VENV:-.venv-conformance}
if ! "$VENV/bin/python" -c "import sglang, vllm" 2>/dev/null; then
  conformance/setup.sh
fi
exec "$VENV/bin/python" -m pytest tests/conformance -m conformance -p no:cacheprovider "$@"
