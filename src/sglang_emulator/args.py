"""The command line: the ``sglang.launch_server`` flags the pipeline passes, plus ``--emu-*``.

Every flag of SGLang 0.5.23's own parser is accepted (the list is ``sglang_flags.tsv``, written
from that parser by ``conformance/record.py``) and reported in ``/server_info``; most change
nothing here. Like SGLang's argparse (``allow_abbrev=True``), an unambiguous prefix of a flag is
that flag, and an unknown or ambiguous flag exits 2 with the usage error.
"""

from __future__ import annotations

import argparse
import re
import shlex
import sys
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

SGLANG_VERSION = "0.5.23"
REDACTED = "<redacted>"
# Flags whose value is a secret: --api-key, --admin-api-key, --hf-token, --*-secret, --*-password.
# (A private copy of the pipeline's rule: this package never imports the pipeline.)
_SECRET_FLAG = re.compile(
    r"^--(?:[a-z0-9-]*-)?(?:api-key|key|token|secret|password|passwd)$|^--[a-z0-9-]*secret",
    re.IGNORECASE,
)


# (flags, type or "bool", default, help) of the sglang.launch_server flags the emulator knows.
SGLANG_FLAGS: list[tuple[tuple[str, ...], Any, Any, str]] = [
    (("--model-path", "--model"), str, None, "checkpoint dir: tokenizer.json, config.json"),
    (("--tokenizer-path",), str, None, "tokenizer dir; None means --model-path"),
    (("--host",), str, "127.0.0.1", "bind address"),
    (("--port",), int, 30000, "bind port"),
    (("--tp-size", "--tensor-parallel-size"), int, 1, "reported only"),
    (("--dp-size", "--data-parallel-size"), int, 1, "one internal_states entry each"),
    (("--mem-fraction-static",), float, None, "reported only; None reports 0.85"),
    (("--enable-hierarchical-cache", "--enable-hicache"), "bool", False, "reported only"),
    (("--hicache-size",), int, 0, "GB; reported only"),
    (("--hicache-ratio",), float, None, "reported only; None reports 2.0"),
    (("--num-continuous-decode-steps",), int, 1, "reported only"),
    (("--trust-remote-code",), "bool", False, "reported only"),
    (("--context-length",), int, None, "None: max_position_embeddings of config.json"),
    (("--reasoning-parser",), str, None, "reported only; /generate ignores it, as SGLang's does"),
    (("--tool-call-parser",), str, None, "reported only"),
    (("--api-key",), str, None, "require 'Authorization: Bearer KEY' (not on /health*)"),
    (("--admin-api-key",), str, None, "accepted; never reported"),
    (("--max-running-requests",), int, None, "decode slots when --emu-running-slots is 0"),
    (("--max-queued-requests",), int, None, "503 when this many wait for a slot"),
    (("--chunked-prefill-size",), int, None, "reported only; None reports 8192"),
    (
        ("--random-seed",),
        int,
        None,
        "fake-model seed of requests without sampling_seed; None draws one per launch, as "
        "SGLang does",
    ),
    (("--skip-server-warmup",), "bool", False, "reported only"),
    (("--enable-metrics",), "bool", False, "reported only"),
    (("--log-level",), str, "info", "reported only"),
    (("--log-requests",), "bool", False, "print one line per finished request"),
    (("--served-model-name",), str, None, "model id in /v1/models; None means --model-path"),
    (("--stream-interval",), int, 1, "reported only"),
    (("--watchdog-timeout",), float, 300.0, "reported only"),
    (("--allow-auto-truncate",), "bool", False, "reported only"),
    (("--skip-tokenizer-init",), "bool", False, "reported only"),
    # Speculative decoding (speculating.py): resolved and reported as SGLang does; the
    # acceptance of each verify step follows --emu-accept-length / --emu-accept-probs.
    (("--speculative-algorithm",), str, None, "EAGLE, EAGLE3, NEXTN or STANDALONE"),
    (
        ("--speculative-draft-model-path", "--speculative-draft-model"),
        str,
        None,
        "the draft: any readable directory stands in for it",
    ),
    (("--speculative-num-steps",), int, None, "draft chain length; None: chosen as SGLang does"),
    (("--speculative-eagle-topk",), int, None, "None: chosen with --speculative-num-steps"),
    (("--speculative-num-draft-tokens",), int, None, "forced to steps + 1 under topk 1"),
    (("--speculative-accept-threshold-single",), float, 1.0, "reported only (below 1: lossy)"),
    (("--speculative-accept-threshold-acc",), float, 1.0, "reported only (below 1: lossy)"),
    (("--speculative-use-rejection-sampling",), "bool", False, "reported only"),
]

_EMU_FLAGS: list[tuple[str, Any, Any, str]] = [
    (
        "--emu-startup-refuse-s",
        float,
        0.0,
        "seconds not listening (connection refused) while printing shard-loading progress",
    ),
    (
        "--emu-startup-503-s",
        float,
        0.0,
        "then seconds listening with /health 503 (warm-up); /model_info and /generate already work",
    ),
    (
        "--emu-die-during-startup",
        str,
        None,
        "print a traceback ending in this MESSAGE to stderr halfway through loading, then exit",
    ),
    ("--emu-die-exit-code", int, 1, "exit code for --emu-die-during-startup"),
    ("--emu-mean-output-tokens", float, 200.0, "mean natural output length (lognormal)"),
    ("--emu-max-output-tokens", int, 16384, "cap of the natural output length"),
    ("--emu-output-sigma", float, 1.0, "lognormal sigma of output lengths (the long tail)"),
    (
        "--emu-output-by-max-new",
        str,
        None,
        "benchmarks: mean natural output length by the "
        "request's max_new_tokens, 'MAX:MEAN,...' (one server serving tiers with different "
        "lengths); other requests use --emu-mean-output-tokens",
    ),
    ("--emu-tool-call-rate", float, 0.5, "chance of a tool-call section when tools are declared"),
    (
        "--emu-max-total-tokens",
        int,
        None,
        "KV pool size reported as max_total_num_tokens; None means 4 x context length",
    ),
    ("--emu-ledger", str, None, "append one JSON line per finished request to PATH"),
    (
        "--emu-running-slots",
        int,
        0,
        "requests decoding at once, the rest queue (0: --max-running-requests, else unlimited)",
    ),
    ("--emu-prefill-tokens-per-s", float, 0.0, "prefill speed per request (0: instant)"),
    ("--emu-decode-ms-per-token", float, 0.0, "decode time per output token (0: instant)"),
    (
        "--emu-physics",
        str,
        None,
        "server physics profile: seed-node, kv-poor or reasoning "
        "(SGLang's scheduler: batch-dependent step time, KV pool, new-token-ratio admission, "
        "retraction; see sglang_emulator/physics.py); replaces the latency flags above",
    ),
    (
        "--emu-time-scale",
        float,
        1.0,
        "with --emu-physics: real seconds per simulated second "
        "(0.01 runs the server 100x faster than life)",
    ),
    ("--emu-fault-seed", int, 0, "seed of the fault stream"),
    ("--emu-fault-400-rate", float, 0.0, "chance of a 400 per /generate request"),
    ("--emu-fault-500-rate", float, 0.0, "chance of a 500 'Internal Server Error'"),
    ("--emu-fault-503-rate", float, 0.0, "chance of a 503 'The request queue is full.'"),
    ("--emu-fault-reset-rate", float, 0.0, "chance of closing the connection with no response"),
    ("--emu-fault-hang-rate", float, 0.0, "chance of holding the request --emu-hang-s seconds"),
    ("--emu-fault-abort-rate", float, 0.0, "chance of a 200 abort with partial output_ids"),
    ("--emu-hang-s", float, 3600.0, "how long a hang fault holds a request"),
    ("--emu-crash-after", int, 0, "os._exit(1) on the Nth /generate request (0: never)"),
    (
        "--emu-accept-length",
        float,
        None,
        "speculating: mean tokens per verify step (1 to steps + 1), every draft position "
        "accepted with the same conditional probability",
    ),
    (
        "--emu-accept-probs",
        str,
        None,
        "speculating: conditional acceptance of draft positions 1, 2, ... 'P1,P2,...' (the "
        "last repeats); neither flag: 0.7 each",
    ),
]
# A real model behind /generate (the CPU lab): torch is imported only when this is given.
_MODEL_BACKEND_FLAGS: list[tuple[str, Any, Any, str]] = [
    (
        "--emu-model-backend",
        str,
        None,
        "'transformers': /generate runs the causal LM at --model-path (and speculates with "
        "an EAGLE-3 draft under --speculative-algorithm EAGLE3); needs torch",
    ),
]
FAULT_RATE_FLAGS = tuple(f for f, *_ in _EMU_FLAGS if f.startswith("--emu-fault-") and "rate" in f)


def _add(
    g: argparse._ArgumentGroup, names: tuple[str, ...], kind: Any, default: Any, help: str
) -> None:
    if kind == "bool":
        g.add_argument(*names, action="store_true", default=False, help=help)
        return
    metavar = {"--emu-die-during-startup": "MESSAGE", "--emu-ledger": "PATH"}.get(names[0])
    required = names[0] == "--model-path"
    g.add_argument(
        *names, type=kind, default=default, help=help, metavar=metavar, required=required
    )


def sglang_flag_table() -> list[tuple[str, list[str]]]:
    """(nargs, option strings) of every flag of SGLang 0.5.23's parser (``sglang_flags.tsv``)."""
    rows = []
    for line in (Path(__file__).parent / "sglang_flags.tsv").read_text().splitlines():
        if line and not line.startswith("#"):
            nargs, names = line.split("\t")
            rows.append((nargs, names.split()))
    return rows


def build_parser() -> argparse.ArgumentParser:
    """SGLang's flags (``allow_abbrev=True`` as in SGLang's parser) plus the ``--emu-*`` ones."""
    p = argparse.ArgumentParser(
        prog="eagle3-datagen emulator",
        description="SGLang-compatible HTTP server with a deterministic fake model (no GPU). "
        "Takes every sglang.launch_server flag; an unknown one exits 2, as in SGLang.",
        allow_abbrev=True,
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    g = p.add_argument_group("sglang.launch_server flags")
    for names, kind, default, help in SGLANG_FLAGS:
        _add(g, names, kind, default, help)
    known = {name for names, *_ in SGLANG_FLAGS for name in names}
    other = p.add_argument_group("other sglang.launch_server flags (accepted, reported only)")
    for nargs, options in sglang_flag_table():
        if known.isdisjoint(options):
            if nargs == "0":
                other.add_argument(*options, action="store_true", help=argparse.SUPPRESS)
            else:
                count = None if nargs == "1" else nargs
                other.add_argument(*options, nargs=count, default=None, help=argparse.SUPPRESS)
    e = p.add_argument_group("emulator-only flags")
    for name, kind, default, help in _EMU_FLAGS:
        _add(e, (name,), kind, default, help)
    for name, kind, default, help in _MODEL_BACKEND_FLAGS:
        _add(e, (name,), kind, default, help)
    return p


@dataclass(frozen=True)
class EmulatorArgs:
    """Typed view of the parsed flags; ``ns`` keeps them all for ``/server_info``."""

    ns: argparse.Namespace
    argv: list[str]
    model_path: str
    tokenizer_path: str | None
    host: str
    port: int
    tp_size: int
    dp_size: int
    mem_fraction_static: float | None
    context_length: int | None
    reasoning_parser: str | None
    tool_call_parser: str | None
    api_key: str | None
    max_running_requests: int | None
    max_queued_requests: int | None
    chunked_prefill_size: int | None
    hicache_ratio: float | None
    random_seed: int | None
    enable_metrics: bool
    log_requests: bool
    served_model_name: str | None
    stream_interval: int
    emu_startup_refuse_s: float
    emu_startup_503_s: float
    emu_die_during_startup: str | None
    emu_die_exit_code: int
    emu_mean_output_tokens: float
    emu_max_output_tokens: int
    emu_output_sigma: float
    emu_output_by_max_new: str | None
    emu_tool_call_rate: float
    emu_max_total_tokens: int | None
    emu_ledger: str | None
    emu_running_slots: int
    emu_prefill_tokens_per_s: float
    emu_decode_ms_per_token: float
    emu_physics: str | None
    emu_time_scale: float
    emu_fault_seed: int
    emu_fault_400_rate: float
    emu_fault_500_rate: float
    emu_fault_503_rate: float
    emu_fault_reset_rate: float
    emu_fault_hang_rate: float
    emu_fault_abort_rate: float
    emu_hang_s: float
    emu_crash_after: int
    emu_accept_length: float | None
    emu_accept_probs: str | None
    emu_model_backend: str | None = None  # --emu-model-backend (model_backend.py)

    @classmethod
    def from_namespace(cls, ns: argparse.Namespace, argv: list[str]) -> EmulatorArgs:
        own = {"ns", "argv"}
        values = {f.name: getattr(ns, f.name) for f in fields(cls) if f.name not in own}
        return cls(ns=ns, argv=argv, **values)

    @property
    def launch_command(self) -> str:
        """SGLang's ``launch_command``: the arguments as given joined by spaces, nothing
        redacted but a ``--watermark-config`` (``server_args.py:717``, ``watermarking/core.py``);
        the API key is in it."""
        out: list[str] = []
        hide_next = False
        for arg in self.argv:
            if hide_next:
                out.append(REDACTED)
                hide_next = False
            elif arg.startswith("--watermark-config="):
                out.append(f"--watermark-config={REDACTED}")
            else:
                out.append(arg)
                hide_next = arg == "--watermark-config"
        return " ".join(out)

    @property
    def launch_command_redacted(self) -> str:
        """The command line for the emulator's own log, secrets hidden."""
        return shlex.join(["python", "-m", "sglang.launch_server", *redact_argv(self.argv)])


def redact_argv(argv: list[str]) -> list[str]:
    """``argv`` with the value of every secret flag (``--api-key K``, ``--x-token=K``) hidden."""
    out: list[str] = []
    hide_next = False
    for arg in argv:
        name, eq, _ = arg.partition("=")
        if hide_next:
            out.append(REDACTED)
            hide_next = False
        elif arg.startswith("--") and _SECRET_FLAG.match(name):
            out.append(f"{name}={REDACTED}" if eq else arg)
            hide_next = not eq
        else:
            out.append(arg)
    return out


def output_by_max_new(spec: str) -> dict[int, float]:
    """``'1024:300,4096:1000'`` -> ``{1024: 300.0, 4096: 1000.0}`` (max_new_tokens -> mean)."""
    out: dict[int, float] = {}
    for part in filter(None, spec.split(",")):
        max_new, sep, mean = part.strip().partition(":")
        try:
            out[int(max_new)] = float(mean)
        except ValueError:
            raise ValueError(f"{part!r} is not MAX_NEW_TOKENS:MEAN") from None
        if not sep or out[int(max_new)] <= 0:
            raise ValueError(f"{part!r} is not MAX_NEW_TOKENS:MEAN with MEAN > 0")
    return out


def parse_args(argv: list[str] | None = None) -> EmulatorArgs:
    """Parse the flags as SGLang's parser does: an unknown or ambiguous one exits 2."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    ns = parser.parse_args(argv)
    rates = [getattr(ns, f[2:].replace("-", "_")) for f in FAULT_RATE_FLAGS]
    if any(r < 0 for r in rates) or sum(rates) > 1.0 + 1e-9:
        parser.error("--emu-fault-*-rate values must be >= 0 and sum to at most 1")
    if ns.emu_output_by_max_new is not None:
        try:
            output_by_max_new(ns.emu_output_by_max_new)
        except ValueError as err:
            parser.error(f"--emu-output-by-max-new: {err}")
    if ns.emu_model_backend not in (None, "transformers"):
        parser.error("--emu-model-backend: choose from transformers")
    if ns.emu_physics is not None:
        from sglang_emulator.physics import PROFILES

        if ns.emu_physics not in PROFILES:
            parser.error(f"--emu-physics: choose from {', '.join(PROFILES)}")
        if ns.emu_time_scale <= 0:
            parser.error("--emu-time-scale must be > 0")
        profile = PROFILES[ns.emu_physics]
        given = {a.partition("=")[0] for a in argv}
        if "--emu-mean-output-tokens" not in given and profile.mean_output_tokens is not None:
            ns.emu_mean_output_tokens = profile.mean_output_tokens
        if "--emu-output-sigma" not in given and profile.output_sigma is not None:
            ns.emu_output_sigma = profile.output_sigma
    return EmulatorArgs.from_namespace(ns, argv)
