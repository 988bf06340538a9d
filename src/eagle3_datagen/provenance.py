"""Where a dataset came from: the run fingerprint stored in the manifest and in every shard.

``content`` holds what decides the tokens (model, tokenizer, template, sampling, tiers, server
settings that change numerics); two runs may share an output directory only if it is equal.
``run`` holds what describes this particular run (time, URL, versions) and may differ.
"""

from __future__ import annotations

import datetime as dt
import hashlib
from importlib.metadata import PackageNotFoundError, version
from typing import Any

import orjson

from eagle3_datagen.chat_tokenizer import ChatTokenizer
from eagle3_datagen.config import PipelineConfig

# /server_info keys that change what the model generates (the rest: ports, paths, logging).
CONTENT_SERVER_ARGS = (
    "model_path",
    "tp_size",
    "dp_size",
    "dtype",
    "quantization",
    "kv_cache_dtype",
    "context_length",
    "reasoning_parser",
    "speculative_algorithm",
    "random_seed",
    "preferred_sampling_params",
    "num_continuous_decode_steps",
)


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
        "sampling": config.sampling.model_dump(),
        "special_tokens": config.special_tokens.model_dump(),
        "validation": config.validation.model_dump(),
        "tiers": {p.name: config.tier(p.tier).model_dump() for p in config.partitions},
        "batch_size": config.batch_size,
        "server": {k: server_args.get(k) for k in CONTENT_SERVER_ARGS},
    }
    digest = hashlib.sha256(orjson.dumps(content, option=orjson.OPT_SORT_KEYS)).hexdigest()
    return {
        "content": content,
        "content_sha256": digest,
        "run": {
            "tokenizer_path": tok["tokenizer_path"],
            "server_args": server_args,
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
