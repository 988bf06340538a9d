"""Serve the parent flow from this machine: no work pool, no worker, one long-lived process.

    python deployments/serve.py                                  # kimi-k2.5, schedule inactive
    python deployments/serve.py configs/demo.yaml --name demo --no-schedule
    python deployments/serve.py configs/kimi-k2.5.yaml --cron "0 2 * * *" --schedule-active
    python deployments/serve.py configs/kimi-k2.5.yaml --server-url http://127.0.0.1:30000 \
        --schedule-active                           # nightly against a server you run yourself

It registers the deployment ``eagle3-datagen/<name>`` (default parameters: the config file,
validated by ``load_config``; with ``--server-url``, every run attaches to that server instead of
launching one) and runs each triggered flow run in a subprocess until stopped with
Ctrl-C, one at a time: a run owns the GPUs and the server port. This is ``flow.serve``; the work
pool route for GPU nodes is ``deployments/prefect.yaml``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from prefect import serve
from prefect.deployments.runner import RunnerDeployment
from prefect.schedules import Cron

from eagle3_datagen_flows.deploy_params import config_parameters
from eagle3_datagen_flows.pipeline import datagen

REPO = Path(__file__).resolve().parents[1]
DEFAULT_CONFIG = REPO / "configs" / "kimi-k2.5.yaml"


def build_deployment(
    config_path: str | Path,
    *,
    name: str,
    cron: str | None = "0 2 * * *",
    schedule_active: bool = False,
    server_url: str | None = None,
) -> RunnerDeployment:
    """The served deployment: validated config as default parameters (and the server to attach
    to, if given), an optional cron."""
    schedules = [Cron(cron, timezone="UTC", slug="nightly", active=schedule_active)] if cron else []
    attach = {"server_url": server_url} if server_url else {}
    deployment = datagen.to_deployment(
        name=name,
        parameters=config_parameters(str(config_path), **attach),
        schedules=schedules,
        enforce_parameter_schema=True,
        tags=["eagle3-datagen", "served"],
        description=f"eagle3-datagen served from this machine with {Path(config_path).name}",
    )
    assert isinstance(deployment, RunnerDeployment)  # sync call: not a coroutine
    return deployment


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("config", nargs="?", default=str(DEFAULT_CONFIG), help="config YAML")
    parser.add_argument("--name", default=None, help="deployment name (default: config name)")
    parser.add_argument("--cron", default="0 2 * * *", help="schedule, UTC (default: 02:00)")
    parser.add_argument("--schedule-active", action="store_true", help="turn the schedule on")
    parser.add_argument("--no-schedule", action="store_true", help="no schedule at all")
    parser.add_argument(
        "--server-url",
        metavar="URL",
        help="attach every run to this running SGLang server (comma-separated: several) "
        "instead of launching one; the deployment's default server_url parameter",
    )
    args = parser.parse_args(argv)
    deployment = build_deployment(
        args.config,
        name=args.name or Path(args.config).stem,
        cron=None if args.no_schedule else args.cron,
        schedule_active=args.schedule_active,
        server_url=args.server_url,
    )
    serve(deployment, limit=1)


if __name__ == "__main__":
    main()
