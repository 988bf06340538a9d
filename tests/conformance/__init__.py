"""Conformance tests: SGLang 0.5.23's real HTTP app with a CPU fake engine (conformance/)."""

import pytest


def requires_sglang() -> None:
    """Skip the calling module unless sglang 0.5.23 is importable (.venv-conformance)."""
    pytest.importorskip(
        "sglang",
        reason="sglang 0.5.23 is not installed here: run conformance/run.sh (.venv-conformance)",
    )
