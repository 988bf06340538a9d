"""Check a finished dataset against its input files (``eagle3-datagen validate DIR --input``).

The manifest records each partition's input (path, size, SHA-256, lines). This reads each input
as it is now and says whether the dataset still describes it: the file is the one recorded;
every line is in the dataset exactly once (a record or a reject, on its line, with its id); and
every record's ``prompt_ids`` are the current line rendered again with the dataset's tokenizer
and chat template. A dataset made from an input that has changed since is reported with the
first line that differs, so the user knows a rerun is due (it sends only what changed).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from eagle3_datagen.errors import DatagenError
from eagle3_datagen.inputs.modes import apply_mode
from eagle3_datagen.inputs.prompts import Prompt, parse_prompt, read_batch
from eagle3_datagen.inputs.scan import scan_input
from eagle3_datagen.render.chat_tokenizer import ChatTokenizer, RenderError
from eagle3_datagen.write.dataset_dir import DatasetDir, iter_rows

MAX_PROBLEMS = 20  # per partition; the count is always given


def _lines_in(
    ds: DatasetDir, name: str
) -> tuple[dict[int, tuple[str | None, list[int] | None]], list[int]]:
    """Per input line: its conversation id and its first turn's prompt ids (None for a line
    only rejected); and the lines with some turn and sample twice. A line has one row per
    generated turn and sample (``samples``, ``regenerate: all_turns``)."""
    seen: dict[int, tuple[str | None, list[int] | None]] = {}
    keys: set[tuple[int, int, int]] = set()
    twice: list[int] = []
    shards, _ = ds.shards(name)
    for shard in shards:
        cols = ("conversation_id", "prompt_ids", "source_line", "turn", "sample")
        rows = list(iter_rows(shard.path, cols))
        if shard.rejects_path is not None:
            rejects = iter_rows(shard.rejects_path, ("id", "source_line", "turn", "sample"))
            rows += [{**r, "conversation_id": None, "prompt_ids": None} for r in rejects]
        for row in rows:
            line = int(row["source_line"])
            key = (line, int(row["turn"] or 0), int(row["sample"] or 0))
            if key in keys:
                twice.append(line)
            keys.add(key)
            conv, first = seen.get(line, (None, None))
            if row["conversation_id"] is not None:  # a reject's id may be a turn's, not the line's
                conv = conv or row["conversation_id"]
            elif conv is None and row.get("turn") is None:
                conv = row.get("id")  # an input reject: the line's own id
            if key[1] == 0 and first is None:
                first = row["prompt_ids"]
            seen[line] = (conv, first)
    return seen, twice


def check_inputs(ds: DatasetDir, tokenizer: ChatTokenizer) -> dict[str, list[str]]:
    """Problems per partition (empty lists when the dataset matches its inputs)."""
    return {name: _check_partition(ds, name, tokenizer) for name in ds.partitions()}


def _check_partition(ds: DatasetDir, name: str, tokenizer: ChatTokenizer) -> list[str]:
    entry = ds.manifest_entry(name) or {}
    recorded: dict[str, Any] = entry.get("input") or {}
    where = f"partition {name!r}"
    if not recorded.get("path"):
        return [f"{where}: the manifest records no input (made by an older version?)"]
    path = Path(str(recorded["path"]))
    batch_size = int(ds.content.get("batch_size") or 0) or max(1, int(recorded.get("lines", 1)))
    try:
        scan = scan_input(name, path, batch_size)
    except DatagenError as err:
        return [f"{where}: {err}"]
    problems: list[str] = []
    now = scan.info
    if (now.size, now.sha256, now.lines) != (
        recorded.get("size"),
        recorded.get("sha256"),
        recorded.get("lines"),
    ):
        problems.append(
            f"{where}: {path} changed since the dataset was made ({recorded.get('lines')} lines, "
            f"sha256 {str(recorded.get('sha256'))[:12]} then; {now.lines} lines, sha256 "
            f"{now.sha256[:12]} now): rerun the pipeline to bring the dataset up to date"
        )

    # Every (line, turn, sample) once, with its line's id; every first turn the current render
    # of its line (later turns' prompts hold the model's own earlier turns).
    seen, twice = _lines_in(ds, name)
    modes = ds.content.get("modes") or {}
    shares = ((ds.content.get("generation") or {}).get(name) or {}).get("modes")
    mismatched: list[str] = []
    missing: list[int] = []
    for spec in scan.batches:
        prompts: list[Prompt] = []
        for line, raw in read_batch(spec):
            if line not in seen:
                if "selection" not in ds.manifest:  # a selection drops whole lines by design
                    missing.append(line)
                continue
            parsed = parse_prompt(raw, line)
            if isinstance(parsed, Prompt):
                parsed = apply_mode(parsed, modes, shares)
            if isinstance(parsed, Prompt):
                prompts.append(parsed)
        rendered = tokenizer.render(prompts) if prompts else []
        for prompt, ids in zip(prompts, rendered, strict=True):
            got_id, got_ids = seen[prompt.line]
            if got_id != prompt.id:
                mismatched.append(
                    f"line {prompt.line}: id {got_id!r} in the dataset, {prompt.id!r} in the input"
                )
            elif got_ids is not None and not isinstance(ids, RenderError) and got_ids != ids:
                mismatched.append(
                    f"line {prompt.line} (id {prompt.id!r}): the record's "
                    "prompt_ids are not this line's prompt"
                )
    extra = sorted(line for line in seen if line > now.lines)
    for count, what, examples in (
        (len(missing), "input lines are not in the dataset", [f"line {x}" for x in missing]),
        (len(twice), "input lines are in the dataset twice", [f"line {x}" for x in twice]),
        (len(extra), "dataset rows point past the end of the input", [f"line {x}" for x in extra]),
        (len(mismatched), "dataset rows do not match the current input", mismatched),
    ):
        if count:
            shown = "; ".join(examples[:3])
            problems.append(f"{where}: {count} {what} (first: {shown})")
    return problems[:MAX_PROBLEMS]
