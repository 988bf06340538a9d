"""The benchmark runs end to end and reports every figure (values are not checked: the
machines are shared, so timings belong in the benchmark's output, never in a test)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
# Every figure runs, a temporary Prefect server among them: ~125 s on a quiet 2-core machine,
# over 400 s on a loaded one; the run's own limit (600 s) decides, not pytest's default 300 s.
@pytest.mark.timeout(660)
def test_quick_benchmark_prints_every_figure(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    proc = subprocess.run(
        [
            sys.executable,
            str(REPO / "benchmarks" / "run_all.py"),
            "--quick",
            "--scale",
            "0.02",
            "--json",
            str(out),
            "--results",  # never the repository's benchmarks/RESULTS.md
            str(tmp_path / "RESULTS.md"),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads(out.read_text())
    parts = {f["part"] for f in results["figures"]}
    assert parts == {"a", "b", "c", "d", "e", "f", "g", "h"}
    for fig in results["figures"]:
        assert fig["verdict"] in ("PASS", "MISS") and fig["target"]
        assert fig["ok"] or fig["why"], "a miss states its reason"
        assert f"({fig['part']}) {fig['name']}" in proc.stdout
    assert results["b"]["budget_peak_tokens"] <= results["b"]["budget_cap_tokens"]
    assert results["a"]["pipeline_rejected"] == 0
    written = (tmp_path / "RESULTS.md").read_text()
    assert written.startswith("# Benchmark results") and "| (g) |" in written
    assert set(results["h"]["bytes_per_record"]) == {"off", "top_k 0", "top_k 1", "top_k 20"}
