"""``eagle3-datagen select --help`` tells a user what the lab measured before they spend GPU
hours on a rule: no rule has beaten random, use ``--by random`` for a cut, and where the
measurements are (pages that exist in the repository)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_select_help_says_no_rule_has_beaten_random_and_where_that_was_measured() -> None:
    exe = Path(sys.executable).with_name("eagle3-datagen")
    out = subprocess.run([str(exe), "select", "--help"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    text = " ".join(out.stdout.split())  # argparse wraps the epilog
    assert "no rule has beaten a random selection" in text
    assert "--by random" in text
    pages = re.findall(r"docs/[\w-]+\.md", text)
    assert "docs/selection-lab.md" in pages and "docs/lab-real.md" in pages
    assert all((ROOT / page).is_file() for page in pages)
