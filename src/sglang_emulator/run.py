"""Process entry point: SGLang's startup phases, then serve until SIGTERM/SIGINT.

Phases, as a launcher sees them: (1) loading, not listening (connection refused) while shard
progress lines are printed; (2) listening with ``/health`` 503 (warm-up) while ``/model_info``
and ``/generate`` already work; (3) ``The server is fired up and ready to roll!`` and 200.
"""

from __future__ import annotations

import asyncio
import gc
import os
import signal
import sys
import time
from pathlib import Path

from aiohttp import web

from sglang_emulator.args import EmulatorArgs, parse_args
from sglang_emulator.backend import BackendError
from sglang_emulator.server import Emulator, log
from sglang_emulator.speculating import SpeculationArgsError
from sglang_emulator.vocab import Vocab

_SHARDS = 64
_FAKE_TRACEBACK = """Traceback (most recent call last):
  File "/usr/local/lib/python3.11/site-packages/sglang/srt/managers/scheduler.py", line 3093, in run_scheduler_process
    scheduler = Scheduler(server_args, port_args, gpu_id, tp_rank, moe_ep_rank, pp_rank, dp_rank)
  File "/usr/local/lib/python3.11/site-packages/sglang/srt/model_executor/model_runner.py", line 887, in load_model
    self.model = get_model(model_config=self.model_config, load_config=self.load_config)
"""  # noqa: E501


def _progress_line(done: int, elapsed: float, total_s: float) -> str:
    pct = int(100 * done / _SHARDS)
    rate = done / elapsed if elapsed > 0 else 0.0
    remain = max(0.0, total_s - elapsed)
    return (
        f"Loading safetensors checkpoint shards: {pct:3d}% Completed | {done}/{_SHARDS} "
        f"[{_mmss(elapsed)}<{_mmss(remain)}, {rate:5.2f}it/s]"
    )


def _mmss(seconds: float) -> str:
    s = int(seconds)
    return f"{s // 60:02d}:{s % 60:02d}"


async def _load_phase(args: EmulatorArgs, stop: asyncio.Event) -> int | None:
    """Print weight-loading progress for ``--emu-startup-refuse-s``; an exit code means die."""
    total = max(0.0, args.emu_startup_refuse_s)
    die_at = total / 2 if args.emu_die_during_startup is not None else None
    log("Load weight begin. avail mem=139.21 GB")
    start = time.monotonic()
    print(_progress_line(0, 0.0, total), flush=True)
    step = total / 16 if total > 0 else 0.0
    while True:
        elapsed = time.monotonic() - start
        if die_at is not None and elapsed >= die_at:
            print(_FAKE_TRACEBACK + str(args.emu_die_during_startup), file=sys.stderr, flush=True)
            log(
                "Received sigquit from a child process. It usually means the child failed.",
                err=True,
            )
            return int(args.emu_die_exit_code)
        if elapsed >= total:
            break
        try:
            await asyncio.wait_for(stop.wait(), timeout=min(step, total - elapsed) or None)
            return 0  # told to stop while loading
        except TimeoutError:
            pass
        elapsed = time.monotonic() - start
        print(
            _progress_line(min(_SHARDS, int(_SHARDS * elapsed / total)), elapsed, total), flush=True
        )
    if total == 0:
        print(_progress_line(_SHARDS, 0.0, 0.0), flush=True)
    log("Load weight end. type=KimiK25ForConditionalGeneration, dtype=torch.bfloat16")
    return None


async def serve(args: EmulatorArgs, vocab: Vocab) -> int:
    """Run the startup phases and the server; returns the process exit code."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)

    try:  # --emu-model-backend: a real model (torch), imported only when asked for
        emulator = Emulator(args, vocab)
    except (SpeculationArgsError, BackendError) as e:  # SGLang fails here too (its args, or
        # loading the model or the draft): a one-line reason
        log(f"ERROR: {e}", err=True)
        return 1
    gc.freeze()  # startup objects (vocab tables, caches) never need scanning again
    code = await _load_phase(args, stop)
    if code is not None:
        return code
    runner = web.AppRunner(
        emulator.build_app(),
        access_log=None,
        handle_signals=False,
        keepalive_timeout=5.0,  # uvicorn's timeout_keep_alive in SGLang
        handler_cancellation=True,  # a client disconnect frees the request's slot
        shutdown_timeout=1.0,  # on SIGTERM, in-flight (e.g. hung) requests get 1 s, not 60
    )
    await runner.setup()
    site = web.TCPSite(runner, args.host, args.port, backlog=4096, reuse_address=True)
    try:
        await site.start()
    except OSError as e:
        log(
            f"ERROR: [Errno {e.errno}] error while attempting to bind on address "
            f"('{args.host}', {args.port}): {e.strerror}",
            err=True,
        )
        await runner.cleanup()
        return 1
    log(f"INFO:     Started server process [{os.getpid()}]")
    log("INFO:     Waiting for application startup.")
    log("INFO:     Application startup complete.")
    log(f"INFO:     Uvicorn running on http://{args.host}:{args.port} (Press CTRL+C to quit)")
    try:
        if args.emu_startup_503_s > 0:
            try:
                await asyncio.wait_for(stop.wait(), timeout=args.emu_startup_503_s)
            except TimeoutError:
                pass
        if not stop.is_set():
            emulator.ready = True
            log("The server is fired up and ready to roll!")
            await stop.wait()
        log("INFO:     Shutting down")
    finally:
        await runner.cleanup()
        if emulator.ledger is not None:
            emulator.ledger.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    """``eagle3-datagen emulator ...`` / ``python -m sglang_emulator ...``."""
    args = parse_args(argv)
    model_path = Path(args.model_path).expanduser()
    tok_path = Path(args.tokenizer_path).expanduser() if args.tokenizer_path else None
    log(f"server_args={args.launch_command_redacted}")
    try:
        vocab = Vocab(model_path, tok_path, trust_remote_code=bool(args.ns.trust_remote_code))
    except (OSError, ValueError) as e:
        log(f"ERROR: cannot load tokenizer: {e}", err=True)
        return 1
    try:
        return asyncio.run(serve(args, vocab))
    except KeyboardInterrupt:
        return 0
