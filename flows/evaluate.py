"""The eval flow: a draft's accept length on a dataset's held-out split, measured by a
speculating server (docs/eval.md). Orchestration only: the library's ``evaluate`` does the
work; this flow names the run as datagen runs are named (``eval <dataset> <date>``), shows the
result as an artifact whose first line and description are the gate's verdict (then the result
and the dataset's latest evals, as ``eagle3-datagen history --evals`` prints them), ends Failed
when the gate fails, with one ERROR line (expected_failures.py), so the failed-run alert
(flows/automations/run-failed.yaml) fires with the verdict. A nightly chains it after
generation with the deployment trigger in deployments/prefect.yaml (docs/operations.md).
"""

from __future__ import annotations

import os
from datetime import UTC, datetime
from typing import Any

from prefect import flow, get_run_logger
from prefect.artifacts import acreate_markdown_artifact
from prefect.runtime import flow_run as current_run

from eagle3_datagen.errors import EvalGateFailed
from eagle3_datagen.evaluate.records import MIN_RECORDS
from eagle3_datagen.evaluate.run import EvalOptions, evaluate
from eagle3_datagen.provenance import EMULATOR
from eagle3_datagen.report.history import EVAL_COLUMNS, eval_rows, history_text, read_history
from eagle3_datagen.report.ui import eval_description, eval_markdown, eval_run_name, keeps_name
from eagle3_datagen_flows import expected_failures

FLOW_NAME = "eagle3-datagen-eval"
EVALS_SHOWN = 10  # the artifact's table of the dataset's latest evals


def _run_name() -> str:
    """``eval synth_100k 2026-11-29 02:00Z``: the dataset and when the run was due (a name a
    person gave, or an earlier attempt's, is kept)."""
    if keeps_name(current_run.name):
        return str(current_run.name)
    when = current_run.scheduled_start_time or datetime.now(UTC)
    return eval_run_name(str(current_run.parameters.get("dataset", "")), when)


@flow(name=FLOW_NAME, flow_run_name=_run_name)
async def datagen_eval(
    dataset: str,
    server_url: str,
    validation: float | None = None,
    seed: int | None = None,
    json_path: str | None = None,
    baseline: str | None = "history",
    max_drop: float = 0.1,
    concurrency: int = 32,
    draft: str | None = None,
    api_key_env: str | None = None,
    min_records: int = MIN_RECORDS,
    train_export: str | None = None,
) -> dict[str, Any]:
    """Eval of ``dataset``'s held-out split (its split.json) on ``server_url``; the baseline
    defaults to the dataset's last passed eval (none on the first night: the gate passes)."""
    # A gate failure logs one ERROR line, not a traceback: this flow never imports partition.py.
    expected_failures.install()
    options = EvalOptions(
        dataset=dataset,
        server_url=server_url,
        validation=validation,
        seed=seed,
        min_records=min_records,
        train_export=train_export,
        json_path=json_path,
        baseline=baseline,
        max_drop=max_drop,
        concurrency=concurrency,
        draft=draft,
        api_key=os.environ.get(api_key_env) if api_key_env else None,
    )
    result = await evaluate(options)
    lines = result.lines()
    logger = get_run_logger()
    for line in lines:
        logger.info(line)
    evals = eval_rows(read_history(dataset))[-EVALS_SHOWN:]
    table = history_text(evals, EVAL_COLUMNS).splitlines() if evals else []
    emulated = result.data["server"].get("kind") == EMULATOR
    await acreate_markdown_artifact(
        key="eval",
        markdown=eval_markdown(result.verdict, lines, table, dataset, emulated=emulated),
        description=eval_description(result.verdict, emulated=emulated),
    )
    if not result.ok:
        raise EvalGateFailed(f"eval gate failed: {result.reason}")
    if result.data["gate"].get("verdict") == "inconclusive":
        logger.warning(f"eval {result.verdict}")
    return result.data
