"""Serve SGLang 0.5.23's real HTTP app with the CPU fake engine behind it.

    python -m conformance.server [sglang serve flags] [--fake-* flags]

The SGLang flags go through SGLang's own parser (`sglang.srt.server_args.prepare_server_args`,
argparse with allow_abbrev): an unknown flag exits 2 exactly as `python -m sglang.launch_server`
does. Start-up follows `Engine._launch_subprocesses` (entrypoints/engine.py:1129-1175) for what
runs in the HTTP process: `configure_logger`, `resolve_once` (which draws `random_seed` when
`--random-seed` is not given, arg_groups/serving_hook.py:660-665), `check_server_args`,
`resolve_auto_parsers`, `publish(role="tokenizer")`. It skips `_set_envs_and_config` (NCCL/CUDA
environment) and the scheduler/detokenizer processes, which `FakeScheduler` replaces. Then it
calls SGLang's own `_setup_and_run_http_server` (entrypoints/http_server.py:2836-3010): global
state, the API-key middleware, `uvicorn.Config(app, timeout_keep_alive=SGLANG_TIMEOUT_KEEP_ALIVE,
loop="uvloop", ...)` and SGLang's warm-up thread (`_execute_server_warmup`, a real
`POST /generate`), so `/health` answers 503 until warm-up has passed.

`--fake-http h11` hides httptools from uvicorn's "auto" choice (as on an install without it);
the default uses httptools when installed, as SGLang does.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from conformance import stubs


def _split_fake_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    parser = argparse.ArgumentParser(prog="conformance.server", add_help=False, allow_abbrev=False)
    parser.add_argument("--fake-log", type=Path, default=None, help="JSONL log of every answer")
    parser.add_argument("--fake-latency-s", type=float, default=0.0)
    parser.add_argument("--fake-kv-pool-tokens", type=int, default=None)
    parser.add_argument("--fake-mean-output-tokens", type=float, default=120.0)
    parser.add_argument("--fake-max-output-tokens", type=int, default=4096)
    parser.add_argument(
        "--fake-load-s", type=float, default=0.0, help="seconds before listening (refused)"
    )
    parser.add_argument(
        "--fake-warmup-delay-s", type=float, default=0.0, help="extra seconds in Starting (503)"
    )
    parser.add_argument("--fake-http", choices=("auto", "h11"), default="auto")
    parser.add_argument(
        "--fake-outputs", type=Path, default=None, help="JSON {rid: output ids} to answer with"
    )
    return parser.parse_known_args(argv)


def main(argv: list[str] | None = None) -> None:
    fake, sglang_argv = _split_fake_args(list(sys.argv[1:] if argv is None else argv))
    if fake.fake_http == "h11":
        sys.modules["httptools"] = None  # type: ignore[assignment]
    stubs.install()
    from conformance import metrics

    metrics.prepare(sglang_argv)  # before prometheus_client is imported, as SGLang's launcher

    from sglang.srt.server_args import prepare_server_args

    # Exits 2 with argparse's message on an unknown or ambiguous flag, as SGLang does.
    server_args = prepare_server_args(sglang_argv)
    # No accelerator here: SGLang's resolution of `device` (arg_groups/serving_hook.py:652,
    # utils/common.py:1122) raises on a CPU box, so the harness sets `cpu` unless the command
    # names a device (set on the record, so `launch_command` stays the command as given).
    # `/server_info` then reports device "cpu".
    if server_args.device is None:
        server_args.device = "cpu"
    if fake.fake_load_s:
        time.sleep(fake.fake_load_s)  # weights "loading": nothing listens yet

    from sglang.srt.entrypoints import http_server
    from sglang.srt.parser.template_detection import resolve_auto_parsers
    from sglang.srt.parser.template_manager import TemplateManager
    from sglang.srt.runtime_context import publish
    from sglang.srt.utils.common import configure_logger

    from conformance.fake_engine import FakeSettings, FakeTokenizerManager

    configure_logger(server_args)
    server_args.resolve_once()
    server_args.check_server_args()
    resolve_auto_parsers(server_args)
    publish(server_args, role="tokenizer")

    settings = FakeSettings(
        kv_pool_tokens=fake.fake_kv_pool_tokens,
        latency_s=fake.fake_latency_s,
        log_path=fake.fake_log,
        mean_output_tokens=fake.fake_mean_output_tokens,
        max_output_tokens=fake.fake_max_output_tokens,
        outputs_path=fake.fake_outputs,
    )
    tokenizer_manager = FakeTokenizerManager(server_args, settings)
    metrics.install(server_args, tokenizer_manager)  # SGLang's own metrics collectors
    template_manager = TemplateManager()
    scheduler_info = tokenizer_manager.scheduler.scheduler_info()
    tokenizer_manager.max_req_input_len = scheduler_info["max_req_input_len"]

    real_warmup = http_server._execute_server_warmup

    def warmup(args: object) -> bool:
        if fake.fake_warmup_delay_s:
            time.sleep(fake.fake_warmup_delay_s)
        return bool(real_warmup(args))

    http_server._setup_and_run_http_server(
        server_args,
        tokenizer_manager,
        template_manager,
        None,
        [scheduler_info],
        None,
        execute_warmup_func=warmup,
    )


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
