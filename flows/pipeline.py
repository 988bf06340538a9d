"""The parent flow: one server session, one subflow per partition (concurrently), a manifest."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger
from prefect.client.schemas.objects import FlowRun
from prefect.context import get_run_context
from prefect.flows import Flow
from prefect.states import State

from eagle3_datagen.chat_tokenizer import ChatTokenizer
from eagle3_datagen.config import PipelineConfig
from eagle3_datagen.errors import ConfigError
from eagle3_datagen.output import read_manifest, write_manifest
from eagle3_datagen.provenance import build_fingerprint, diff_content, parquet_metadata
from eagle3_datagen.server_session import open_server
from eagle3_datagen.sglang.launcher import server_state_dir
from eagle3_datagen.sglang.orphans import kill_recorded
from flows.partition import generate_partition


def _stop_server_hook(flow: Flow[Any, Any], flow_run: FlowRun, state: State[Any]) -> None:
    """on_cancellation/on_crashed: may run in another process, so kill by the pidfile."""
    params = flow_run.parameters or {}
    cfg = params.get("config")
    output_dir = (
        cfg.get("output_dir") if isinstance(cfg, dict) else getattr(cfg, "output_dir", None)
    )
    if output_dir:
        kill_recorded(server_state_dir(output_dir), str(flow_run.id))


def _guard_output(
    config: PipelineConfig, fingerprint: dict[str, Any], overwrite: bool, logger: Any
) -> None:
    """Refuse to mix this run's data with data made under another fingerprint.

    With ``overwrite`` the old data of the configured partitions is deleted instead, so that
    no batch made under the old fingerprint is mistaken for done.
    """
    output_dir = config.output_dir
    old = read_manifest(output_dir)
    if old is None:
        return
    old_fp = old.get("fingerprint", {})
    if old_fp.get("content_sha256") == fingerprint["content_sha256"]:
        return
    changes = diff_content(old_fp.get("content", {}), fingerprint["content"])
    if overwrite:
        logger.warning(f"--overwrite: deleting data made with other settings ({changes[:3]})")
        for part in config.partitions:
            shutil.rmtree(Path(output_dir) / part.name, ignore_errors=True)
        return
    raise ConfigError(
        f"{output_dir} holds data made with different settings; changed: "
        + "; ".join(changes[:10])
        + ". Use a new output directory or --overwrite."
    )


@flow(
    name="eagle3-datagen",
    on_cancellation=[_stop_server_hook],
    on_crashed=[_stop_server_hook],
)
async def datagen(
    config: PipelineConfig,
    partitions: list[str] | None = None,
    server_url: str | None = None,
    overwrite: bool = False,
) -> dict[str, Any]:
    """Generate EAGLE-3 training data for the selected partitions (all when none are given)."""
    logger = get_run_logger()
    names = partitions or [p.name for p in config.partitions]
    for name in names:
        config.partition(name)  # unknown names fail before anything starts
    run_key = str(get_run_context().flow_run.id)  # type: ignore[union-attr]
    tokenizer = ChatTokenizer(
        config.model.tokenizer_dir,
        trust_remote_code=config.model.trust_remote_code,
        chat_template_kwargs=config.model.chat_template_kwargs,
    )

    async with open_server(config, run_key=run_key, logger=logger, server_url=server_url) as srv:
        fingerprint = build_fingerprint(config, tokenizer, srv.facts.server_args, srv.facts.version)
        _guard_output(config, fingerprint, overwrite, logger)
        manifest: dict[str, Any] = {"fingerprint": fingerprint, "status": "running",
                                    "partitions": {}}  # fmt: skip
        write_manifest(config.output_dir, manifest)
        states = await asyncio.gather(
            *(
                generate_partition(
                    config=config,
                    partition=name,
                    server_url=srv.url,
                    context_length=srv.facts.context_length,
                    parquet_metadata=parquet_metadata(fingerprint),
                    supervisor_key=srv.supervisor_key,
                    return_state=True,
                )
                for name in names
            )
        )

    failed: list[str] = []
    for name, state in zip(names, states, strict=True):
        if state.is_completed():
            manifest["partitions"][name] = await state.aresult()
        else:
            failed.append(name)
            manifest["partitions"][name] = {"partition": name, "status": state.type.value,
                                            "error": state.message}  # fmt: skip
    manifest["status"] = "failed" if failed else "completed"
    write_manifest(config.output_dir, manifest)
    if failed:
        reasons = "; ".join(f"{n}: {manifest['partitions'][n]['error']}" for n in failed)
        raise RuntimeError(f"{len(failed)} of {len(names)} partitions failed: {reasons}")
    return manifest
