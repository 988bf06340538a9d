"""The output directory's ``README.md``: a Hugging Face dataset card for the dataset on disk.

The YAML front matter declares one config per partition (``data_files`` globs of its shards),
so ``datasets.load_dataset(DIR, "<partition>")`` and the Hub's viewer find the data with no
loading script; the body says where the data came from (the run fingerprint), how much there
is, what it looks like (the same figures as the Prefect data artifacts) and how to load it.
Written from the manifest and the shards, so it is rewritten whole after every run.

Data made by the bundled SGLang emulator (the fingerprint's ``run.server_kind``) says so in its
title, first paragraph and provenance: its tokens come from a fake model, and a card that read
like model output could get a draft model trained on them.

Partitions are listed in the config's order (the fingerprint keeps it), and the default config
is the config's first partition: ``load_dataset(DIR)`` without a name loads what the config
put first, not what sorts first.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from eagle3_datagen.config import ServingProfile
from eagle3_datagen.provenance import EMULATOR, recorded_server_kind
from eagle3_datagen.report.acceptance import acceptance_markdown, read_acceptance
from eagle3_datagen.report.coverage import Coverage, coverage_markdown
from eagle3_datagen.report.data_picture import (
    PartitionPicture,
    partition_picture,
    picture_markdown,
)
from eagle3_datagen.report.history import latest_eval_markdown, read_history
from eagle3_datagen.write.manifest import update_manifest
from eagle3_datagen.write.records import RECORD_SCHEMA
from eagle3_datagen.write.shards import PartitionOutput, atomic_write_bytes

CARD = "README.md"

# Every column of a record, in the schema's order (a test holds this to RECORD_SCHEMA).
COLUMNS: dict[str, str] = {
    "id": "the record's id, unique in its partition (`<line id>`, `#s<n>` for sample n, "
    "`#t<k>` for generated turn k)",
    "partition": "the partition it belongs to",
    "prompt_ids": "list<int32>: the prompt rendered by the model's chat template and tokenizer",
    "output_ids": "list<int32>: exactly as the server returned them, stop token included",
    "finish_reason": "`stop` or `length`",
    "prompt_tokens": "tokens in `prompt_ids`",
    "completion_tokens": "tokens in `output_ids`",
    "truncated": "the output was cut at `max_new_tokens` or the context length",
    "think_end_index": "position of `</think>` in `output_ids`, -1 if none",
    "cached_tokens": "prompt tokens the server had cached (prefix reuse)",
    "e2e_latency": "seconds the server took for the request",
    "source_line": "the line (JSONL) or row (Parquet) of the input file, 1-based",
    "rid": "the request id sent to the server",
    "conversation_id": "the input line's id (several records share it with `samples` or "
    "`regenerate: all_turns`)",
    "turn": "which generated assistant turn of the conversation, 0-based",
    "sample": "which sample of the line, 0-based",
    "sampling": "struct: temperature, top_p, top_k, min_p, repetition_penalty, max_new_tokens, "
    "sampling_seed (null: none sent), as this request was sent",
    "stop_reason": "why the conversation stopped after this turn "
    "(`tool_call_diverged: ...`, `truncated: ...`, `turn_rejected: ...`), null if it went on",
    "model_prompt_ids": "image prompts: `prompt_ids` with each image placeholder expanded to "
    "the image's tokens, the ids the model saw (`prompt_tokens` counts them); null for text",
    "images": "image prompts: list of struct ref, sha256, width, height, format, tokens, in "
    "placeholder order (`docs/images.md`); null for text",
    "has_tools": "the prompt declared tools (null in data written before this column)",
    "has_tool_results": "the conversation so far holds a tool result (null in data written "
    "before this column)",
    "user_turns": "user messages in the conversation so far (null in data written before this "
    "column)",
    "mode": "the line's serving mode, e.g. `thinking` or `instant` (`docs/modes.md`): `default` "
    "when none is declared, `custom` for a line's own chat_template_kwargs; null in data "
    "written before this column",
    "spec_verify_ct": "speculating server: verify steps of the request; null when the server "
    "sent no speculative fields (it does not speculate), never 0",
    "spec_num_correct_drafts": "speculating server: draft tokens accepted (bonus tokens "
    "excluded); null as above",
    "spec_num_proposed_drafts": "speculating server: `spec_verify_ct * (draft tokens - 1)`; "
    "null as above",
    "spec_accept_length": "speculating server: `completion_tokens / spec_verify_ct`, SGLang's "
    "per-request figure; null as above",
    "spec_accept_rate": "speculating server: correct / proposed drafts; null as above",
    "spec_correct_drafts_histogram": "speculating server: list<int32>, verify steps by number of "
    "drafts accepted; null as above",
    "output_logprobs": "`logprobs: {top_k: K}` partitions: list<float32>, the target's logprob "
    "of each output token (one per `output_ids` entry; SGLang's `output_token_logprobs`, of the "
    "temperature-scaled distribution before top-p/top-k); null when not asked (docs/logprobs.md)",
    "top_logprob_ids": "K > 0: list<list<int32>>, per output token the K likeliest ids, "
    "highest first (entries whose probability underflowed to 0 dropped); null otherwise",
    "top_logprobs": "K > 0: list<list<float32>>, their logprobs; the sampled token's entry, "
    "where it is among them, equals its `output_logprobs` value; null otherwise",
    "entropy_mean": "K > 0: the mean over output tokens of a lower-bound entropy estimate (nats) "
    "from the top-K: the top-K's own terms plus the tail mass counted as one token; null "
    "otherwise",
    "entropy_p90": "K > 0: the 90th percentile (nearest rank) of the same per-token estimate",
}


def config_order(names: list[str], fingerprint: dict[str, Any]) -> list[str]:
    """``names`` in the config's partition order (the fingerprint's), unknown ones last."""
    content = fingerprint.get("content") or {}
    order = list(content.get("generation") or content.get("tiers") or {})
    rank = {name: i for i, name in enumerate(order)}
    return sorted(names, key=lambda n: (rank.get(n, len(rank)), n))


def _model_name(fingerprint: dict[str, Any]) -> str:
    return Path(str((fingerprint.get("content") or {}).get("model_path") or "a model")).name


def from_emulator(fingerprint: dict[str, Any]) -> bool:
    """Whether the run's tokens came from the bundled emulator rather than SGLang."""
    return recorded_server_kind(fingerprint.get("run") or {}) == EMULATOR


def card_title(fingerprint: dict[str, Any]) -> str:
    model = _model_name(fingerprint)
    if from_emulator(fingerprint):
        return f"EAGLE-3 test data from the SGLang emulator (not {model} output)"
    return f"EAGLE-3 training data from {model}"


def _emulated_server(fingerprint: dict[str, Any]) -> str:
    version = (fingerprint.get("run") or {}).get("sglang_version")
    return f"`sglang_emulator` (the stand-in for SGLang {version or '?'})"


def card_front_matter(partitions: list[str], fingerprint: dict[str, Any]) -> dict[str, Any]:
    """The card's YAML header: configs/data_files per partition, in the config's order; the
    default is the config's first partition when it is on disk (else none)."""
    content = fingerprint.get("content") or {}
    first = next(iter(content.get("generation") or content.get("tiers") or {}), None)
    configs: list[dict[str, Any]] = []
    for name in config_order(partitions, fingerprint):
        config: dict[str, Any] = {
            "config_name": name,
            "data_files": [{"split": "train", "path": f"{name}/part-*.parquet"}],
        }
        if name == first:
            config["default"] = True
        configs.append(config)
    tags = ["eagle3", "speculative-decoding", "synthetic", "token-ids"]
    return {
        "configs": configs,
        "task_categories": ["text-generation"],
        "tags": [*tags, "emulator-output"] if from_emulator(fingerprint) else tags,
        "pretty_name": card_title(fingerprint),
    }


def _intro(fingerprint: dict[str, Any]) -> str:
    """What the data is: model output to train on, or emulator output that only looks like it."""
    if not from_emulator(fingerprint):
        return (
            "Training data for an EAGLE-3 draft model: prompts rendered with the target model's "
            "own chat template and tokenizer, and the **exact token ids** the target model "
            "generated (SGLang's native `/generate`, no text round trip, stop token included). "
            "Every record was validated token by token. Train on `prompt_ids + output_ids` with "
            "the loss on `output_ids`."
        )
    model = _model_name(fingerprint)
    return (
        f"**Emulator output, not model output.** The `output_ids` were made by "
        f"{_emulated_server(fingerprint)}, which ships with eagle3-datagen: a fake model whose "
        f"answers are made-up tokens from {model}'s vocabulary. They are not "
        f"what {model} would generate, so do not train a draft model on them; this data shows "
        "the format and exercises the pipeline. The prompts were rendered with the model's own "
        "chat template and tokenizer, the outputs came through the same native `/generate` "
        "(stop token included), and every record was validated token by token."
    )


def _provenance(manifest: dict[str, Any]) -> str:
    fingerprint = manifest.get("fingerprint", {})
    content = fingerprint.get("content", {})
    run = fingerprint.get("run", {})
    tok = content.get("tokenizer", {})
    sampling = content.get("sampling", {})
    server = {k: v for k, v in (content.get("server") or {}).items() if v not in (None, False)}
    emulated = from_emulator(fingerprint)
    rows = [
        ("model (emulated, not run)" if emulated else "model", content.get("model_path")),
        ("tokenizer", run.get("tokenizer_path")),
        ("vocabulary", f"{tok.get('vocab_size', '?')} tokens, sha256 {tok.get('vocab_sha256')}"),
        ("chat template sha256", content.get("chat_template_sha256")),
        ("chat template kwargs", content.get("chat_template_kwargs") or "{}"),
        ("serving modes (docs/modes.md)", _modes(content)),
        ("sampling", ", ".join(f"{k}={v}" for k, v in sampling.items() if v is not None)),
        ("server settings that change tokens", ", ".join(f"{k}={v}" for k, v in server.items())),
        ("speculative decoding (lossless)", _speculation(run.get("server_args") or {})),
        ("SGLang", None if emulated else run.get("sglang_version")),
        ("eagle3-datagen", run.get("pipeline_version")),
        ("fingerprint (content sha256)", fingerprint.get("content_sha256")),
        ("first written", manifest.get("first_written") or run.get("created_at")),
        ("last run started", run.get("created_at")),
        ("selected from (eagle3-datagen select)", _selection(manifest.get("selection"))),
    ]
    lines = ["| | |", "|---|---|"]
    if emulated:  # first, in words: what made the tokens
        lines.append(
            f"| generated by | {_emulated_server(fingerprint)}: emulator output, not model output |"
        )
    lines += [f"| {k} | `{v}` |" for k, v in rows if v not in (None, "")]
    return "\n".join(lines)


def _modes(content: dict[str, Any]) -> str | None:
    """Each mode's kwargs and each partition's mixture in one line; None without modes."""
    modes = content.get("modes")
    if not modes:
        return None
    declared = ", ".join(f"{name} {kwargs}" for name, kwargs in modes.items())
    mixes = [
        f"{part}: " + ", ".join(f"{name} {share:g}" for name, share in gen["modes"].items())
        for part, gen in (content.get("generation") or {}).items()
        if gen.get("modes")
    ]
    return "; ".join([declared, *mixes])


def _selection(sel: dict[str, Any] | None) -> str | None:
    """A selection's source, rule and seed in one line (docs/select.md); None for a run."""
    if not sel:
        return None
    params = "".join(f", {k}={v}" for k, v in (sel.get("params") or {}).items())
    return (
        f"{sel.get('source')} (content sha256 {str(sel.get('source_content_sha256'))[:12]}): "
        f"rule {sel.get('rule')}{params}, keep {sel.get('keep')} of each partition's "
        f"conversations, seed {sel.get('seed')}"
    )


def _speculation(server_args: dict[str, Any]) -> str | None:
    """The run's speculative settings in one line; None when it did not speculate."""
    if not server_args.get("speculative_algorithm"):
        return None
    keys = ("algorithm", "draft_model_path", "num_steps", "eagle_topk", "num_draft_tokens")
    return ", ".join(f"{k}={server_args.get('speculative_' + k)}" for k in keys)


def _columns() -> str:
    lines = ["| column | |", "|---|---|"]
    lines += [f"| `{name}` | {COLUMNS.get(name, '')} |" for name in RECORD_SCHEMA.names]
    return "\n".join(lines)


def _counts(pictures: list[PartitionPicture], manifest: dict[str, Any]) -> str:
    entries = manifest.get("partitions", {})
    lines = [
        "| partition | status | input lines done | accepted | rejected | truncated | "
        "output tokens | repeated prompts (exact / near) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for p in pictures:
        entry = entries.get(p.partition, {})
        tokens = sum(p.output.values)
        lines.append(
            f"| {p.partition} | {entry.get('status', '-')} | {p.input_lines} | {p.accepted} | "
            f"{p.rejected} | {p.truncated} ({p.truncation_rate:.1%}) | {tokens} | "
            f"{_repeated(entry.get('input') or {})} |"
        )
    return "\n".join(lines)


def _repeated(scan: dict[str, Any]) -> str:
    """The input scan's repeated prompts and what its policy did (docs/coverage.md)."""
    policy = scan.get("near_duplicates_policy") or "off"
    if policy == "off":
        return "not looked for"
    counts = f"{scan.get('exact_duplicates', 0)} / {scan.get('near_duplicates', 0)}"
    return f"{counts}, {'dropped' if policy == 'drop' else 'kept'}"


def _acceptance(output_dir: str | Path, names: list[str]) -> list[str]:
    """The card's acceptance section, over every partition; none without spec fields."""
    paths = [p for name in names for p in PartitionOutput(output_dir, name).shard_paths()]
    acc = read_acceptance(paths)
    if acc is None:
        return []
    return [acceptance_markdown(acc, heading="##").rstrip()]


WHAT_IT_LOOKS_LIKE = "## What the data looks like"
LATEST_EVAL = "## Latest eval"


def _latest_eval(output_dir: str | Path) -> list[str]:
    section = latest_eval_markdown(read_history(output_dir))
    return [section] if section else []


def update_latest_eval(output_dir: str | Path) -> bool:
    """Put the last recorded eval into an existing card, in place (an eval reads no shards):
    the section replaced, or added before the data's picture. False without a card."""
    path = Path(output_dir) / CARD
    try:
        text = path.read_text()
    except FileNotFoundError:
        return False
    section = latest_eval_markdown(read_history(output_dir))
    if section is None:
        return False
    if LATEST_EVAL in text:
        start = text.index(LATEST_EVAL)
        end = text.find("\n## ", start + len(LATEST_EVAL))
        text = text[:start] + section + ("\n" + text[end:] if end >= 0 else "\n")
    elif WHAT_IT_LOOKS_LIKE in text:
        at = text.index(WHAT_IT_LOOKS_LIKE)
        text = text[:at] + section + "\n\n" + text[at:]
    else:
        text = text.rstrip("\n") + "\n\n" + section + "\n"
    atomic_write_bytes(path, text.encode())
    return True


def card_text(
    output_dir: str | Path,
    manifest: dict[str, Any],
    pictures: list[PartitionPicture],
    coverage: Coverage | None = None,
) -> str:
    fingerprint = manifest.get("fingerprint", {})
    by_name = {p.partition: p for p in pictures}
    names = config_order(list(by_name), fingerprint)
    pictures = [by_name[n] for n in names]
    header = yaml.safe_dump(
        card_front_matter(names, fingerprint), sort_keys=False, allow_unicode=True
    )
    configs = card_front_matter(names, fingerprint)["configs"]
    first = next((c["config_name"] for c in configs if c.get("default")), None)
    first = first or (names[0] if names else "PARTITION")
    body = [
        f"# {card_title(fingerprint)}",
        _intro(fingerprint),
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
        _columns(),
        "## Provenance",
        _provenance(manifest),
        "## Counts",
        _counts(pictures, manifest),
        *_acceptance(output_dir, names),
        *([coverage_markdown(coverage, heading="##").rstrip()] if coverage else []),
        *_latest_eval(output_dir),
        WHAT_IT_LOOKS_LIKE,
        *(picture_markdown(p, heading="###") for p in pictures),
    ]
    return f"---\n{header}---\n\n" + "\n\n".join(body) + "\n"


def refresh_dataset_card(
    output_dir: str | Path,
    manifest: dict[str, Any],
    profile: ServingProfile | None = None,
    coverage: Coverage | None = None,
) -> dict[str, PartitionPicture]:
    """Picture every partition of the manifest from disk and rewrite the card; return them.

    The card is ``<output_dir>/README.md``, written atomically. Both the one-node flow and the
    fan-out call this once their manifest is final, so the card always describes the whole
    directory, whichever run wrote it last. ``coverage`` (already read, e.g. for an artifact) or
    else one read here against ``profile`` goes in its section.
    """
    pictures = {
        name: partition_picture(output_dir, name) for name in manifest.get("partitions", {})
    }
    if coverage is None:
        coverage = card_coverage(output_dir, profile)
    text = card_text(output_dir, manifest, list(pictures.values()), coverage)
    atomic_write_bytes(Path(output_dir) / CARD, text.encode())
    return pictures


def card_coverage(output_dir: str | Path, profile: ServingProfile | None) -> Coverage | None:
    """The directory's coverage for the card; None (no section) when it cannot be read."""
    from eagle3_datagen.errors import DatagenError
    from eagle3_datagen.report.coverage import dataset_coverage

    try:
        return dataset_coverage(output_dir, profile)
    except DatagenError:
        return None


@dataclass(frozen=True, slots=True)
class WrittenDataset:
    """What :func:`write_manifest_and_card` wrote and read: the manifest, each partition's
    picture, the coverage; ``card_error`` says why the card could not be written (the
    manifest, the dataset's contract, was)."""

    manifest: dict[str, Any]
    pictures: dict[str, PartitionPicture] = field(default_factory=dict)
    coverage: Coverage | None = None
    card_error: str | None = None


def write_manifest_and_card(
    output_dir: str | Path,
    fingerprint: dict[str, Any],
    partitions: dict[str, dict[str, Any]],
    profile: ServingProfile | None = None,
) -> WrittenDataset:
    """The run's manifest (``update_manifest``), then the dataset card from it: one call, so
    every run that writes a manifest leaves a card that describes it, however it was started.
    A manifest that cannot be written raises; a card that cannot be, is said in the result."""
    manifest = update_manifest(output_dir, fingerprint, partitions)
    try:
        coverage = card_coverage(output_dir, profile)
        pictures = refresh_dataset_card(output_dir, manifest, profile, coverage)
    except Exception as err:  # the card describes the data; the data and manifest are written
        return WrittenDataset(manifest, card_error=f"{type(err).__name__}: {err}")
    return WrittenDataset(manifest, pictures, coverage)
