"""``pip install .`` into a fresh virtual environment, then every command from there, away from
the checkout: the installed names, the entry point, and the alarm automation read from the
package's own data (not from a checkout that a wheel install does not have)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import REPO
from tests.support.prefect import Hook, PrefectServer, notification_block

pytestmark = pytest.mark.slow

COMMANDS = [
    [],
    ["run"],
    ["demo"],
    ["validate"],
    ["export"],
    ["coverage"],
    ["failures"],
    ["alarm"],
    ["alarm", "install"],
    ["alarm", "unschedulable"],
    ["emulator"],
]


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A venv with the project installed from the checkout as a wheel; returns its bin/."""
    venv = tmp_path_factory.mktemp("wheel") / "venv"
    uv = shutil.which("uv")
    if uv:  # the same install as pip's, from uv's cache: seconds instead of minutes
        subprocess.run([uv, "venv", "-q", "--python", sys.executable, str(venv)], check=True)
        # pyproject.toml's dependencies are ranges: held to uv.lock's versions, the ones the
        # other tests run, so the newest release within a range does not enter CI unannounced.
        locked = venv.parent / "locked.txt"
        export = ["export", "--frozen", "--no-dev", "--no-emit-project", "--no-hashes", "-q"]
        subprocess.run([uv, *export, "-o", str(locked)], cwd=REPO, check=True)
        install = [uv, "pip", "install", "-q", "--python", str(venv / "bin/python")]
        install += ["-c", str(locked), str(REPO)]
    else:
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        install = [str(venv / "bin/python"), "-m", "pip", "install", "-q", str(REPO)]
    subprocess.run(install, check=True, timeout=600)
    return venv / "bin"


def test_the_wheel_installs_only_the_projects_names(installed: Path):
    code = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    site = subprocess.run(
        [str(installed / "python"), "-c", code], capture_output=True, text=True, check=True
    ).stdout.strip()
    names = {p.name for p in Path(site).iterdir() if (p / "__init__.py").exists()}
    ours = {n for n in names if n.startswith(("eagle3_datagen", "sglang_emulator"))}
    assert ours == {
        "eagle3_datagen",
        "eagle3_datagen_flows",
        "eagle3_datagen_tasks",
        "eagle3_datagen_cli",
        "sglang_emulator",
    }
    assert "flows" not in names and "tasks" not in names
    automations = Path(site) / "eagle3_datagen_flows/automations"
    for name in ("throughput-low", "run-failed", "pod-unschedulable", "pod-unschedulable-failed"):
        assert (automations / f"{name}.yaml").is_file(), name


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(c) or "top")
def test_every_command_runs_from_the_wheel(installed: Path, tmp_path: Path, command: list[str]):
    proc = subprocess.run(
        [str(installed / "eagle3-datagen"), *command, "--help"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert "usage:" in proc.stdout.lower()


def test_alarm_install_from_the_wheel(
    installed: Path, tmp_path: Path, prefect_server: PrefectServer
):
    """The automation file comes with the package: created on a real Prefect server from a
    directory that is not the checkout."""
    srv = prefect_server
    notification_block(srv, Hook().url)
    proc = subprocess.run(
        [str(installed / "eagle3-datagen"), "alarm", "install", "--block", "eagle3-alerts"],
        cwd=tmp_path,
        env=srv.env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    try:
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert "notifies through" in proc.stdout
        made = _shipped(srv)
        # Both shipped automations, read from the installed package's data.
        assert sorted(a["name"] for a in made) == [
            "eagle3-datagen run failed",
            "eagle3-datagen throughput low",
        ]
    finally:  # the other e2e tests of this server expect no automation of their own making
        for automation in _shipped(srv):
            srv.delete(f"/automations/{automation['id']}")


def _shipped(srv: PrefectServer) -> list[dict]:
    """The automations `alarm install` makes; the eval deployment's own chain trigger
    (deployments/prefect.yaml) is the deployment's, not ours to count or delete."""
    return [a for a in srv.post("/automations/filter") if a["name"].startswith("eagle3-datagen ")]
