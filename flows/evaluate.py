"""The eval flow: a draft's accept length on a dataset's held-out split, measured by a
speculating server (docs/eval.md). Orchestration only: the library's ``evaluate`` does the
work; this flow shows the result as an artifact and ends Failed when the gate fails, so the
failed-run alert (flows/automations/run-failed.yaml) fires. A nightly chains it after
generation with the deployment trigger in deployments/prefect.yaml (docs/operations.md).
"""

from __future__ import annotations

import os
from typing import Any

from prefect import flow, get_run_logger
from prefect.artifacts import acreate_markdown_artifact

from eagle3_datagen.errors import EvalGateFailed
from eagle3_datagen.evaluate.run import EvalOptions, evaluate

FLOW_NAME = "eagle3-datagen-eval"


@flow(name=FLOW_NAME)
async def datagen_eval(
    dataset: str,
    server_url: str,
    validation: float = 0.2,
    seed: int = 0,
    json_path: str | None = None,
    baseline: str | None = "history",
    max_drop: float = 0.1,
    concurrency: int = 32,
    draft: str | None = None,
    api_key_env: str | None = None,
) -> dict[str, Any]:
    """Eval of ``dataset``'s held-out split on ``server_url``; the baseline defaults to the
    dataset's last recorded eval (none on the first night: the gate passes)."""
    options = EvalOptions(
        dataset=dataset,
        server_url=server_url,
        validation=validation,
        seed=seed,
        json_path=json_path,
        baseline=baseline,
        max_drop=max_drop,
        concurrency=concurrency,
        draft=draft,
        api_key=os.environ.get(api_key_env) if api_key_env else None,
    )
    result = await evaluate(options)
    lines = result.lines()
    for line in lines:
        get_run_logger().info(line)
    await acreate_markdown_artifact(
        key="eval", markdown="\n".join(f"    {line}" for line in lines), description=lines[1]
    )
    if not result.ok:
        raise EvalGateFailed(f"eval gate failed: {result.reason}")
    return result.data
