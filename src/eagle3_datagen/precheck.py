"""Everything a run can check before it launches a server, checked first.

Loading Kimi-K2.5 takes many minutes of eight GPUs; a missing prompts file or a special token
the tokenizer splits must not wait for that. :func:`check_before_server` runs in the parent flow
before the server is launched or attached to: partition names, every selected input file (it
exists, can be read, and how many lines it has: the partition's size in every report), the
tokenizer and chat template, the special tokens, the output path (a directory this user can
write), and every setting the config alone decides that differs from the data already in the
output directory (the server's own settings are compared once it answers: ``write/guard.py``).
Every input problem is reported at once.

None of it needs Prefect: the command line runs these checks too, before it starts Prefect's
temporary server (seconds to a minute), so a bad input, tokenizer or output is told in the
flow's own words without waiting for it; :func:`check_inputs_and_output` (no tokenizer) first,
in about a second. Line counts (here) and the tokenizer (``render/chat_tokenizer.py``) are
cached in the process, so the flow's own check after the command line's costs nothing.
"""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pyarrow.parquet as pq

from eagle3_datagen.config import PipelineConfig
from eagle3_datagen.errors import InputFileError, OutputConflictError, OutputWriteError
from eagle3_datagen.generate.kwargs_probe import check_kwargs
from eagle3_datagen.generate.plan import load_tokenizer
from eagle3_datagen.inputs.prompts import is_parquet
from eagle3_datagen.provenance import build_fingerprint, diff_content
from eagle3_datagen.render.chat_tokenizer import ChatTokenizer
from eagle3_datagen.render.token_ids import TokenIds
from eagle3_datagen.sglang.health import check_listens
from eagle3_datagen.sglang.pool import split_urls
from eagle3_datagen.write.manifest import read_manifest
from eagle3_datagen.write.shards import PartitionOutput

_CHUNK = 1 << 22
# Line counts by (path, device, inode, size, mtime): the command line's early check and the
# flow's, in one process, read a large input once.
_COUNTED: dict[tuple[str, int, int, int, int], int] = {}


@dataclass(slots=True)
class RunCheck:
    """What the checks established: the partitions to run, their sizes, the tokenizer."""

    names: list[str]
    sizes: dict[str, int]  # input lines (JSONL) or rows (Parquet) per partition
    tokenizer: ChatTokenizer
    ids: TokenIds


def check_attached_servers(config: PipelineConfig, server_url: str | None) -> None:
    """Each server an attach run names (``server_url``, or the config's in attach mode) has
    something listening, or :class:`~eagle3_datagen.errors.ServerStartupError` in the gate's
    own words after the gate's wait for a refused URL. A launch run has nothing to check."""
    urls = server_url or (config.server.url if config.server.mode == "attach" else None)
    for one in split_urls(urls or ""):
        asyncio.run(check_listens(one))


def count_input_lines(path: str | Path) -> int:
    """Lines of a JSONL file as the batch planner counts them (a last line without a newline
    counts), or rows of a Parquet file; raises OSError or pyarrow's errors if unreadable."""
    path = Path(path)
    st = path.stat()
    key = (str(path.resolve()), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
    if key in _COUNTED:
        return _COUNTED[key]
    if is_parquet(path):
        count = int(pq.ParquetFile(path).metadata.num_rows)
    else:
        lines, last = 0, b"\n"
        with path.open("rb") as fh:
            while chunk := fh.read(_CHUNK):
                lines += chunk.count(b"\n")
                last = chunk[-1:]
        count = lines + (last != b"\n")
    _COUNTED[key] = count
    return count


def input_problem(partition: str, path: str) -> str | int:
    """The partition's size, or why its input cannot be used (names the file and partition)."""
    p = Path(path)
    if not p.exists():
        return f"{path}: input file not found for partition {partition!r}"
    if not p.is_file():
        return f"{path}: not a file (input of partition {partition!r})"
    try:
        return count_input_lines(p)
    except OSError as err:
        return f"{path}: cannot read input of partition {partition!r}: {err.strerror or err}"
    except Exception as err:  # pyarrow raises several types for a corrupt Parquet file
        return f"{path}: not a readable Parquet file (partition {partition!r}): {err}"


def output_path_problem(output_dir: str | Path) -> str | None:
    """Why the run could not create or write ``output_dir``, or None when it can."""
    path = Path(output_dir)
    if path.exists():
        if not path.is_dir():
            return f"{path}: the output directory is a file, not a directory"
        if not os.access(path, os.W_OK | os.X_OK):
            return f"{path}: the output directory is not writable by this user"
        return None
    parent = path.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        return f"{path}: cannot create the output directory: {parent} is a file"
    if not os.access(parent, os.W_OK | os.X_OK):
        return f"{path}: cannot create the output directory: {parent} is not writable"
    return None


def _config_content(fingerprint: dict[str, Any]) -> dict[str, Any]:
    """The fingerprint's content without what only the server can say."""
    return {k: v for k, v in (fingerprint.get("content") or {}).items() if k != "server"}


def _shard_content(output: PartitionOutput) -> dict[str, Any] | None:
    """The fingerprint content the partition's first readable shard was written under."""
    for path in output.shard_paths():
        try:
            meta = pq.read_schema(path).metadata or {}
            raw = meta.get(b"eagle3_datagen.fingerprint")
            return dict(orjson.loads(raw)) if raw is not None else None
        except (OSError, ValueError):
            continue  # a torn file: its batch is redone anyway
    return None


def config_conflicts(
    config: PipelineConfig, tokenizer: ChatTokenizer, output_dir: str | Path, names: list[str]
) -> list[str]:
    """The settings this config decides that differ from the data in ``output_dir``: the
    manifest's fingerprint, and the first shard of each partition this run would write."""
    ours = _config_content(build_fingerprint(config, tokenizer, {}, None))
    changes: list[str] = []
    old = read_manifest(output_dir)
    if old is not None:
        changes = diff_content(_config_content(old.get("fingerprint") or {}), ours)
    for name in names:
        shard = _shard_content(PartitionOutput(output_dir, name))
        if shard is not None and not changes and diff_content(_config_content(shard), ours):
            changes.append(f"{name}: shards written under other settings")
    return changes


def check_output(
    config: PipelineConfig, tokenizer: ChatTokenizer, names: list[str], *, overwrite: bool
) -> None:
    """The output path can be written and holds no data made under other config settings
    (with ``overwrite`` such data is deleted once the server's settings are known)."""
    problem = output_path_problem(config.output_dir)
    if problem is not None:
        raise OutputWriteError(problem)
    if overwrite or not Path(config.output_dir).is_dir():
        return
    changes = config_conflicts(config, tokenizer, config.output_dir, names)
    if changes:
        raise OutputConflictError(
            f"{config.output_dir} holds data made with different settings; changed: "
            + "; ".join(changes[:10])
            + ". Use a new output directory or --overwrite."
        )


def check_inputs(config: PipelineConfig, names: list[str] | None, sizes: dict[str, int]) -> None:
    """Every selected partition is known (ConfigError) and its input usable (InputFileError,
    every unusable input one line each); ``sizes`` gets each readable input's line count."""
    parts = config.select(names)  # ConfigError names the unknown one
    problems: list[str] = []
    for part in parts:
        result = input_problem(part.name, part.input)
        if isinstance(result, str):
            problems.append(result)
        else:
            sizes[part.name] = result
    if problems:
        raise InputFileError("; ".join(problems))


def check_inputs_and_output(config: PipelineConfig, partitions: list[str] | None) -> None:
    """The checks of :func:`check_before_server` that need no tokenizer: partition names,
    input files, an output path this user can write. Same errors, same words."""
    check_inputs(config, partitions, {})
    problem = output_path_problem(config.output_dir)
    if problem is not None:
        raise OutputWriteError(problem)


def check_before_server(
    config: PipelineConfig,
    partitions: list[str] | None,
    sizes: dict[str, int] | None = None,
    *,
    overwrite: bool | None = None,
) -> RunCheck:
    """Check names, inputs, tokenizer, special tokens and output; raise the first kind that
    fails.

    Raises ConfigError (unknown partition, model or mode kwargs the chat template refuses),
    InputFileError (every unusable input, one line
    each), TokenizerError (tokenizer, chat template or a special token), OutputWriteError (the
    output path cannot be written), OutputConflictError (the output holds data made under other
    settings of the config; not with ``overwrite``; None leaves the output to the caller).
    ``sizes``, if given, is filled with each
    readable input's line count as it is found, so a caller reporting a failed check still
    knows the partitions' sizes.
    """
    names = [p.name for p in config.select(partitions)]  # ConfigError: an unknown one
    sizes = {} if sizes is None else sizes
    check_inputs(config, names, sizes)
    tokenizer = load_tokenizer(config)
    ids = TokenIds.resolve(tokenizer, config.special_tokens)
    for name in names:  # the model's and each assigned mode's kwargs (a line's: its plan)
        check_kwargs(tokenizer, config.model.modes, config.partition(name).modes, {})
    if overwrite is not None:
        check_output(config, tokenizer, names, overwrite=overwrite)
    return RunCheck(names=names, sizes=sizes, tokenizer=tokenizer, ids=ids)
