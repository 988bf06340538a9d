"""Our launch command, parsed by SGLang's own parser, served by SGLang's own `/server_info`,
checked by our pre-flight."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from conformance.process import REPO, RealAppProcess, free_port, model_dir
from tests.conformance import requires_sglang

requires_sglang()
pytestmark = pytest.mark.conformance

from eagle3_datagen.config import LaunchFlags, load_config  # noqa: E402
from eagle3_datagen.sglang.launch_command import build_launch_command  # noqa: E402

CONFIG = REPO / "configs" / "kimi-k2.5.yaml"

VARIANTS: dict[str, dict[str, Any]] = {
    "as-shipped": {},
    "context-and-tokenizer": {"context_length": 131072},
    "no-hicache": {"enable_hierarchical_cache": False},
    "extra-args": {"extra_args": ["--max-running-requests", "64", "--random-seed", "7"]},
}


def _command(variant: dict[str, Any], **model: Any) -> list[str]:
    cfg = load_config(CONFIG)
    launch = {k: v for k, v in variant.items() if k in LaunchFlags.model_fields}
    rest = {k: v for k, v in variant.items() if k not in launch}
    flags = cfg.server.launch.model_copy(update=launch)
    server = cfg.server.model_copy(update={**rest, "launch": flags})
    spec = cfg.model.model_copy(update=model)
    return build_launch_command(server, spec, "python", api_key="k-123")


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_sglang_parser_takes_our_command(name: str) -> None:
    from sglang.srt.server_args import prepare_server_args

    cmd = _command(VARIANTS[name])
    assert cmd[1:3] == ["-m", "sglang.launch_server"]
    args = prepare_server_args(cmd[3:])  # argparse exits 2 on anything SGLang does not know
    cfg = load_config(CONFIG)
    assert args.model_path == cfg.model.path
    assert args.tp_size == cfg.server.launch.tp_size
    assert args.api_key == "k-123"
    assert args.random_seed is not None  # fixed by us, not drawn per launch
    if VARIANTS[name].get("enable_hierarchical_cache", True):
        assert args.enable_hierarchical_cache is True
        assert args.hicache_size == cfg.server.launch.hicache_size_gb


def test_server_info_from_our_command_passes_preflight(tmp_path: Path) -> None:
    """The as-shipped command (model path swapped for a loadable Kimi-layout dir) served by
    SGLang's own route, then our pre-flight against it."""
    import asyncio

    from eagle3_datagen.sglang.client import SGLangClient
    from eagle3_datagen.sglang.preflight import preflight

    model = model_dir(tmp_path)
    cfg = load_config(CONFIG)
    port = free_port()
    server = cfg.server.model_copy(update={"port": port, "host": "127.0.0.1"})
    spec = cfg.model.model_copy(update={"path": str(model), "tokenizer_path": None})
    cmd = build_launch_command(server, spec, "python", api_key="k-123")
    argv = cmd[3:]
    i = argv.index("--model-path")
    del argv[i : i + 2]
    for flag in ("--host", "--port"):
        j = argv.index(flag)
        del argv[j : j + 2]
    app = RealAppProcess(tmp_path, *argv, model_path=model, port=port).wait_ready()
    try:

        async def check() -> Any:
            client = SGLangClient(app.url, api_key="k-123")
            try:
                return await preflight(
                    client, server=server, model=spec, sampling=cfg.sampling, api_key="k-123"
                )
            finally:
                await client.aclose()

        facts = asyncio.run(check())
    finally:
        app.stop()
    assert facts.version == "0.5.23"
    assert facts.server_args.get("tp_size") == cfg.server.launch.tp_size
    assert "k-123" not in repr(facts.server_args)  # the real /server_info leaks it; we scrub it
    assert facts.max_req_input_len is not None
