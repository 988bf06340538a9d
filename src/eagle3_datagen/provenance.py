"""Where a dataset came from: the run fingerprint stored in the manifest and in every shard.

``content`` holds what decides the tokens (model, tokenizer, template, render reference,
sampling, tiers, the turns and samples each partition generates, and the server settings in
:data:`CONTENT_SERVER_ARGS`); two runs may share an output directory only if it is equal, so
a rerun, a resume after a server restart or another node of a fan-out must produce the same
``content``. ``run`` holds what describes this particular run (time, URL,
versions, every server arg, and ``server_kind``: whether SGLang or the bundled emulator made
the tokens) and may differ.

The rule for a server arg: it is content when it changes which tokens a request can get, i.e.
the model's weights or precision, the prompt the model sees, the sampling a request gets, or the
length rules. It is not when it only changes where, how fast, or in which order the server
computes: ports, memory, caches, parallelism and scheduling change floating-point summation
order (and so bits), but not the model or the distribution sampled from. ``random_seed`` is
resolved at random per launch when ``--random-seed`` is not given; without deterministic
inference the batch a request lands in decides its draws anyway, and with it a request is seeded
by its own ``sampling_seed`` (the pipeline sends one per prompt when ``sampling.seed`` is set),
so it is left out. Each decision and its reason is in
:data:`CONTENT_SERVER_ARGS` and :data:`RUN_ONLY_SERVER_ARGS` (and docs/fingerprint.md).
"""

from __future__ import annotations

import datetime as dt
import hashlib
from importlib.metadata import PackageNotFoundError, version
from typing import Any

import orjson

from eagle3_datagen.config import PipelineConfig
from eagle3_datagen.render.chat_tokenizer import ChatTokenizer

# /server_info keys that decide the tokens a request gets, and why.
CONTENT_SERVER_ARGS: dict[str, str] = {
    "model_path": "the weights served",
    "revision": "the weights served (a hub revision)",
    "dtype": "the model's precision",
    "quantization": "the model's precision",
    "quantization_param_path": "the KV-cache scaling factors",
    "kv_cache_dtype": "the precision of the attention over the prompt and output so far",
    "enable_fp32_lm_head": "the precision of the logits sampled from",
    "json_model_override_args": "the model's config (e.g. rope scaling)",
    "context_length": "which prompts are rejected and where outputs are truncated",
    "allow_auto_truncate": "whether a too-long prompt is cut instead of rejected",
    "preferred_sampling_params": "merged into every request's sampling parameters",
    "enable_deterministic_inference": "whether a request's sampling_seed is honoured",
}

# /server_info keys one might expect in the fingerprint, and why they are left out (every other
# key, such as host, port, api_key, log settings, is run information for the same reason).
RUN_ONLY_SERVER_ARGS: dict[str, str] = {
    "random_seed": "random per launch unless given; seeds no request that has a sampling_seed",
    "tp_size": "parallelism: the same model and sampling, summed in another order",
    "dp_size": "parallelism: the same model and sampling on more replicas",
    "num_continuous_decode_steps": "scheduling: how often the scheduler runs between steps",
    "mem_fraction_static": "memory: how many requests fit at once",
    "enable_hierarchical_cache": "caching: prefix reuse, the same tokens",
    "hicache_size": "caching: prefix reuse, the same tokens",
    "reasoning_parser": "changes text only; pre-flight refuses a server that has one",
    "tokenizer_path": "requests carry token ids; the server's tokenizer makes only text",
    "sampling_defaults": "applies to the OpenAI endpoints, not to /generate",
    "host": "where the server listens",
    "port": "where the server listens",
    "speculative_algorithm": "lossless (pre-flight refuses a lossy setting): the target's own "
    "distribution, reached in fewer steps; every speculative_* field is in run.server_args",
}
# Content keys kept at a fixed value: they were content once, and dropping the key would change
# the fingerprint of every dataset written before.
_RETIRED_CONTENT_SERVER_ARGS: dict[str, Any] = {"speculative_algorithm": None}


# What ``run.server_kind`` records: which server made the output tokens.
SGLANG = "sglang"
EMULATOR = "sglang-emulator"


def server_kind(server_info: dict[str, Any]) -> str:
    """``sglang-emulator`` when the server says it is the bundled emulator (its ``/server_info``
    has ``"emulator": true``, a key SGLang does not have), else ``sglang``. Read from what the
    server reports, not from how it was launched, so an attached emulator is caught too."""
    return EMULATOR if server_info.get("emulator") is True else SGLANG


def recorded_server_kind(run: dict[str, Any]) -> str:
    """A fingerprint's ``run.server_kind``; for a manifest written before the field existed,
    worked out from the ``server_args`` it recorded."""
    kind = run.get("server_kind")
    return str(kind) if kind else server_kind(run.get("server_args") or {})


def pipeline_version() -> str:
    try:
        return version("eagle3-datagen")
    except PackageNotFoundError:
        return "0+unknown"


def build_fingerprint(
    config: PipelineConfig,
    tokenizer: ChatTokenizer,
    server_args: dict[str, Any],
    sglang_version: str | None,
) -> dict[str, Any]:
    tok = tokenizer.fingerprint()
    content = {
        "model_path": config.model.path,
        "tokenizer": {k: v for k, v in tok.items() if k != "tokenizer_path"},
        "chat_template_sha256": tok["chat_template_sha256"],
        "chat_template_kwargs": config.model.chat_template_kwargs,
        # Serving modes (docs/modes.md): each mode's kwargs change its lines' prompts; absent
        # when none are declared, so older fingerprints stay the same.
        **({"modes": config.model.modes} if config.model.modes else {}),
        # Which prompt ids the data holds: SGLang's chat path's or the raw template's.
        "render": tokenizer.reference,
        "sampling": config.sampling.model_dump(),
        "special_tokens": config.special_tokens.model_dump(),
        "validation": config.validation.model_dump(),
        "tiers": {p.name: config.tier(p.tier).model_dump() for p in config.partitions},
        # Which turns and how many samples each line gives: a marker committed under other
        # values would count as done (and the record columns came with them).
        "generation": {
            p.name: {
                "regenerate": p.regenerate,
                "samples": p.samples,
                "temperatures": p.temperatures,
                # Asking for logprobs draws the same tokens (docs/logprobs.md) but gives the
                # records more columns; absent when off, so older fingerprints stay the same.
                **({"logprobs": p.logprobs.model_dump()} if p.logprobs else {}),
                # The mixture decides which lines render in which mode (absent when none).
                **({"modes": p.modes} if p.modes else {}),
            }
            for p in config.partitions
        },
        "batch_size": config.batch_size,
        "server": {
            **{k: server_args.get(k) for k in CONTENT_SERVER_ARGS},
            **_RETIRED_CONTENT_SERVER_ARGS,
        },
    }
    digest = hashlib.sha256(orjson.dumps(content, option=orjson.OPT_SORT_KEYS)).hexdigest()
    return {
        "content": content,
        "content_sha256": digest,
        "run": {
            "tokenizer_path": tok["tokenizer_path"],
            "server_args": server_args,
            "server_kind": server_kind(server_args),
            "sglang_version": sglang_version,
            "pipeline_version": pipeline_version(),
            "created_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        },
    }


def parquet_metadata(fingerprint: dict[str, Any]) -> dict[str, str]:
    """Key-value metadata for every Parquet shard (the fingerprint travels with the data)."""
    return {
        "eagle3_datagen.fingerprint": orjson.dumps(
            fingerprint, option=orjson.OPT_SORT_KEYS
        ).decode(),
        "eagle3_datagen.content_sha256": fingerprint["content_sha256"],
    }


def diff_content(old: dict[str, Any], new: dict[str, Any], prefix: str = "") -> list[str]:
    """Dotted paths of the content fields that differ, for a readable refusal."""
    changed = []
    for key in sorted(set(old) | set(new)):
        a, b, path = old.get(key), new.get(key), f"{prefix}{key}"
        if isinstance(a, dict) and isinstance(b, dict):
            changed.extend(diff_content(a, b, path + "."))
        elif a != b:
            changed.append(f"{path}: {a!r} -> {b!r}")
    return changed
