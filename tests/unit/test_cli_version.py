"""``eagle3-datagen --version``: the installed package's version, from the installed command."""

from __future__ import annotations

import subprocess
import sys
from importlib.metadata import version
from pathlib import Path


def test_version_is_the_installed_packages() -> None:
    exe = Path(sys.executable).with_name("eagle3-datagen")
    out = subprocess.run([str(exe), "--version"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == f"eagle3-datagen {version('eagle3-datagen')}"
