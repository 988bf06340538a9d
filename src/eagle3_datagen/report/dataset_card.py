"""The output directory's ``README.md``: a Hugging Face dataset card for the dataset on disk.

The YAML front matter declares one config per partition (``data_files`` globs of its shards),
so ``datasets.load_dataset(DIR, "<partition>")`` and the Hub's viewer find the data with no
loading script; the body says where the data came from (the run fingerprint), how much there
is, what it looks like (the same figures as the Prefect data artifacts) and how to load it.
Written from the manifest and the shards, so it is rewritten whole after every run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from eagle3_datagen.report.data_picture import (
    PartitionPicture,
    partition_picture,
    picture_markdown,
)
from eagle3_datagen.write.shards import atomic_write_bytes

CARD = "README.md"


def card_front_matter(partitions: list[str], fingerprint: dict[str, Any]) -> dict[str, Any]:
    """The card's YAML header: configs/data_files per partition, the first one the default."""
    configs: list[dict[str, Any]] = []
    for i, name in enumerate(partitions):
        config: dict[str, Any] = {
            "config_name": name,
            "data_files": [{"split": "train", "path": f"{name}/part-*.parquet"}],
        }
        if i == 0:
            config["default"] = True
        configs.append(config)
    model = str(fingerprint.get("content", {}).get("model_path") or "a model")
    return {
        "configs": configs,
        "task_categories": ["text-generation"],
        "tags": ["eagle3", "speculative-decoding", "synthetic", "token-ids"],
        "pretty_name": f"EAGLE-3 training data from {Path(model).name}",
    }


def _provenance(fingerprint: dict[str, Any]) -> str:
    content = fingerprint.get("content", {})
    run = fingerprint.get("run", {})
    tok = content.get("tokenizer", {})
    sampling = content.get("sampling", {})
    server = {k: v for k, v in (content.get("server") or {}).items() if v not in (None, False)}
    rows = [
        ("model", content.get("model_path")),
        ("tokenizer", run.get("tokenizer_path")),
        ("vocabulary", f"{tok.get('vocab_size', '?')} tokens, sha256 {tok.get('vocab_sha256')}"),
        ("chat template sha256", content.get("chat_template_sha256")),
        ("chat template kwargs", content.get("chat_template_kwargs") or "{}"),
        ("sampling", ", ".join(f"{k}={v}" for k, v in sampling.items() if v is not None)),
        ("server settings that change tokens", ", ".join(f"{k}={v}" for k, v in server.items())),
        ("SGLang", run.get("sglang_version")),
        ("eagle3-datagen", run.get("pipeline_version")),
        ("fingerprint (content sha256)", fingerprint.get("content_sha256")),
        ("first written", run.get("created_at")),
    ]
    lines = ["| | |", "|---|---|"]
    lines += [f"| {k} | `{v}` |" for k, v in rows if v not in (None, "")]
    return "\n".join(lines)


def _counts(pictures: list[PartitionPicture], manifest: dict[str, Any]) -> str:
    entries = manifest.get("partitions", {})
    lines = [
        "| partition | status | input lines done | accepted | rejected | truncated | "
        "output tokens |",
        "|---|---|---|---|---|---|---|",
    ]
    for p in pictures:
        entry = entries.get(p.partition, {})
        tokens = sum(p.output.values)
        lines.append(
            f"| {p.partition} | {entry.get('status', '-')} | {p.input_lines} | {p.accepted} | "
            f"{p.rejected} | {p.truncated} ({p.truncation_rate:.1%}) | {tokens} |"
        )
    return "\n".join(lines)


def card_text(
    output_dir: str | Path, manifest: dict[str, Any], pictures: list[PartitionPicture]
) -> str:
    fingerprint = manifest.get("fingerprint", {})
    names = [p.partition for p in pictures]
    header = yaml.safe_dump(
        card_front_matter(names, fingerprint), sort_keys=False, allow_unicode=True
    )
    first = names[0] if names else "PARTITION"
    body = [
        f"# {card_front_matter(names, fingerprint)['pretty_name']}",
        "Training data for an EAGLE-3 draft model: prompts rendered with the target model's own "
        "chat template and tokenizer, and the **exact token ids** the target model generated "
        "(SGLang's native `/generate`, no text round trip, stop token included). Every record "
        "was validated token by token. Train on `prompt_ids + output_ids` with the loss on "
        "`output_ids`.",
        "## How to load",
        "```python\n"
        "from datasets import load_dataset\n\n"
        f'ds = load_dataset("{Path(output_dir).resolve()}", "{first}", split="train")\n'
        f'print(ds[0]["prompt_ids"][:10], ds[0]["output_ids"][-3:])\n'
        "```\n\n"
        "One config per partition (`" + "`, `".join(names) + "`). Rejected lines, with the "
        "stage and reason, are in `<partition>/rejects/*.parquet`; "
        "`eagle3-datagen validate DIR` re-checks every record, `eagle3-datagen export DIR "
        "--format specforge|speculators` writes a trainer's JSONL.",
        "## Columns",
        "`id`, `partition`, `prompt_ids` (list<int32>), `output_ids` (list<int32>, as the "
        "server returned them), `finish_reason` (`stop`/`length`), `prompt_tokens`, "
        "`completion_tokens`, `truncated`, `think_end_index` (position of `</think>` in "
        "`output_ids`, -1 if none), `cached_tokens`, `e2e_latency`, `source_line`, `rid`.",
        "## Provenance",
        _provenance(fingerprint),
        "## Counts",
        _counts(pictures, manifest),
        "## What the data looks like",
        *(picture_markdown(p, heading="###") for p in pictures),
    ]
    return f"---\n{header}---\n\n" + "\n\n".join(body) + "\n"


def write_dataset_card(
    output_dir: str | Path, manifest: dict[str, Any], pictures: list[PartitionPicture]
) -> Path:
    """Write ``<output_dir>/README.md`` (atomically) and return its path."""
    path = Path(output_dir) / CARD
    atomic_write_bytes(path, card_text(output_dir, manifest, pictures).encode())
    return path


def refresh_dataset_card(
    output_dir: str | Path, manifest: dict[str, Any]
) -> dict[str, PartitionPicture]:
    """Picture every partition of the manifest from disk and rewrite the card; return them.

    Both the one-node flow and the fan-out call this once their manifest is final, so the card
    always describes the whole directory, whichever run wrote it last.
    """
    pictures = {
        name: partition_picture(output_dir, name) for name in manifest.get("partitions", {})
    }
    write_dataset_card(output_dir, manifest, list(pictures.values()))
    return pictures
