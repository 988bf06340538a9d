"""Deployment parameters from a YAML config, validated like ``eagle3-datagen run`` does.

``deployments/prefect.yaml`` calls :func:`config_parameters` as a build step of
``prefect deploy``, and ``deployments/serve.py`` calls it directly, so a deployment's default
parameters are exactly what ``load_config`` accepts (relative paths made absolute) and a broken
config fails the deploy, not the 2 a.m. run.
"""

from __future__ import annotations

from typing import Any

from eagle3_datagen.config import load_config


def config_parameters(path: str, **overrides: Any) -> dict[str, Any]:
    """``{"config": <validated config as JSON>}``, plus any other flow parameters given."""
    config = load_config(path)
    return {"config": config.model_dump(mode="json"), **overrides}
