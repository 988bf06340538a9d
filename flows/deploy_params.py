"""Deployment parameters from a YAML config, validated like ``eagle3-datagen run`` does.

``deployments/prefect.yaml`` calls :func:`config_parameters` as a build step of
``prefect deploy``, and ``deployments/serve.py`` calls it directly, so a deployment's default
parameters are exactly what ``load_config`` accepts (relative paths made absolute) and a broken
config fails the deploy, not the 2 a.m. run. As a command it prints a run's parameters::

    python -m eagle3_datagen_flows.deploy_params my.yaml --partition B1_glaive \\
        | prefect deployment run 'eagle3-datagen/kimi-k2.5' --params -
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from eagle3_datagen.config import load_config
from eagle3_datagen.errors import ConfigError


def config_parameters(path: str, **overrides: Any) -> dict[str, Any]:
    """``{"config": <validated config as JSON>}``, plus any other flow parameters given."""
    config = load_config(path)
    config.select(overrides.get("partitions"))  # an unknown name fails here, not the run
    return {"config": config.model_dump(mode="json"), **overrides}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m eagle3_datagen_flows.deploy_params",
        description="Print a config's flow parameters as JSON for "
        "`prefect deployment run NAME --params -`.",
    )
    parser.add_argument("config", help="pipeline config YAML")
    parser.add_argument("--partition", action="append", metavar="NAME", help="repeatable")
    parser.add_argument("--server-url", help="attach to a running server")
    parser.add_argument("--overwrite", action="store_true")
    args = parser.parse_args(argv)
    extra: dict[str, Any] = {}
    if args.partition:
        extra["partitions"] = args.partition
    if args.server_url:
        extra["server_url"] = args.server_url
    if args.overwrite:
        extra["overwrite"] = True
    try:
        params = config_parameters(args.config, **extra)
    except ConfigError as err:
        print(f"eagle3_datagen_flows.deploy_params: {err}", file=sys.stderr)
        return 2
    print(json.dumps(params))
    return 0


if __name__ == "__main__":
    sys.exit(main())
