"""The SGLang launch command of a config, and the API key it passes.

The seed's flags in the seed's order (the manifest fingerprints them, and operators compare
them with the command they ran by hand), then ``extra_args``, then the key. ``engine:
emulator`` runs the bundled emulator with exactly the same flags.
"""

from __future__ import annotations

import os
import shlex
import sys
from collections.abc import Iterable, Sequence

from eagle3_datagen.config import ModelSpec, ServerSpec, names_reasoning_parser
from eagle3_datagen.errors import ConfigError
from eagle3_datagen.sglang.redact import redact_argv

SGLANG_MODULE = "sglang.launch_server"
EMULATOR_MODULE = "sglang_emulator"  # a package beside this one, run as a process, never imported


# --------------------------------------------------------------------------- API key


def resolve_api_key(server: ServerSpec) -> str | None:
    """The API key from the environment variable named by ``server.api_key_env``, if any.

    The config holds only the variable's *name*, so the key never lands in the config, the
    Prefect parameters or the manifest.
    """
    if not server.api_key_env:
        return None
    value = os.environ.get(server.api_key_env)
    if not value:
        raise ConfigError(
            f"server.api_key_env names ${server.api_key_env}, but that environment variable is "
            "unset or empty"
        )
    return value


# --------------------------------------------------------------------------- command


def _flag_name(arg: str) -> str:
    return arg.split("=", 1)[0]


def build_launch_command(
    server: ServerSpec,
    model: ModelSpec,
    python: str = sys.executable,
    *,
    api_key: str | None = None,
) -> list[str]:
    """The ``launch_server`` argv for ``server`` (the seed's flags, in the seed's order).

    ``engine="emulator"`` runs the bundled emulator with exactly the same flags, so the same
    code path is exercised without a GPU. ``--reasoning-parser`` is refused even if the config
    validator was bypassed: it must not be set for raw ``output_ids`` (docs/contract.md).
    """
    for arg in server.extra_args:
        if names_reasoning_parser(arg):
            raise ConfigError(
                f"server.extra_args: {arg!r} is refused: SGLang reads it as --reasoning-parser, "
                "and the training data must be the raw output_ids, reasoning included"
            )
    module = SGLANG_MODULE if server.engine == "sglang" else EMULATOR_MODULE
    cmd = [python, "-m", module, "--model-path", model.path]
    cmd += ["--tp-size", str(server.launch.launch_tp_size)]
    cmd += ["--mem-fraction-static", f"{server.launch.mem_fraction_static:g}"]
    if server.launch.enable_hierarchical_cache:
        cmd += [
            "--enable-hierarchical-cache",
            "--hicache-size",
            str(server.launch.hicache_size_gb),
        ]
    cmd += ["--num-continuous-decode-steps", str(server.launch.num_continuous_decode_steps)]
    if model.trust_remote_code:
        cmd.append("--trust-remote-code")
    cmd += ["--host", server.host, "--port", str(server.port)]
    if model.tokenizer_path:
        cmd += ["--tokenizer-path", model.tokenizer_path]
    if server.context_length is not None:
        cmd += ["--context-length", str(server.context_length)]
    if server.enable_metrics and "--enable-metrics" not in server.extra_args:
        cmd.append("--enable-metrics")  # /metrics, read by concurrency: auto
    if not any(_flag_name(arg) == "--random-seed" for arg in server.extra_args):
        cmd += ["--random-seed", str(server.launch.random_seed)]
    cmd += speculative_flags(server)
    cmd += list(server.extra_args)
    if api_key:
        cmd += ["--api-key", api_key]
    return cmd


def speculative_flags(server: ServerSpec) -> list[str]:
    """``--speculative-*`` for ``server.speculative`` (none when it is off)."""
    spec = server.speculative
    if spec is None:
        return []
    return [
        "--speculative-algorithm",
        spec.algorithm,
        "--speculative-draft-model-path",
        spec.draft_model_path,
        "--speculative-num-steps",
        str(spec.num_steps),
        "--speculative-eagle-topk",
        str(spec.eagle_topk),
        "--speculative-num-draft-tokens",
        str(spec.draft_tokens),
    ]


def format_command(cmd: Sequence[str], secrets: Iterable[str] = ()) -> str:
    """A shell-quoted, redacted command line for logs."""
    return shlex.join(redact_argv(cmd, secrets))
