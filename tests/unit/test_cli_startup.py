"""The command line imports Prefect only for the commands that use it: parsing the arguments
(and so ``eagle3-datagen emulator``, ``validate``, ``export``, ``history``) does not."""

from __future__ import annotations

import subprocess
import sys

from tests.support import REPO


def test_parsing_the_command_line_imports_no_prefect():
    code = (
        "import sys\n"
        "from eagle3_datagen_cli.main import build_parser\n"
        "build_parser().parse_args(['history', 'somewhere'])\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'prefect'))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip() == "[]"
