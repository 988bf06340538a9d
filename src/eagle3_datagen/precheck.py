"""Everything a run can check before it launches a server, checked first.

Loading Kimi-K2.5 takes many minutes of eight GPUs; a missing prompts file or a special token
the tokenizer splits must not wait for that. :func:`check_before_server` runs in the parent flow
before the server is launched or attached to: partition names, every selected input file (it
exists, can be read, and how many lines it has: the partition's size in every report), the
tokenizer and chat template, and the special tokens. Every input problem is reported at once.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from eagle3_datagen.config import PipelineConfig
from eagle3_datagen.errors import InputFileError
from eagle3_datagen.generate.plan import load_tokenizer
from eagle3_datagen.inputs.prompts import is_parquet
from eagle3_datagen.render.chat_tokenizer import ChatTokenizer
from eagle3_datagen.validate.tokens import TokenIds

_CHUNK = 1 << 22


@dataclass(slots=True)
class RunCheck:
    """What the checks established: the partitions to run, their sizes, the tokenizer."""

    names: list[str]
    sizes: dict[str, int]  # input lines (JSONL) or rows (Parquet) per partition
    tokenizer: ChatTokenizer
    ids: TokenIds


def count_input_lines(path: str | Path) -> int:
    """Lines of a JSONL file as the batch planner counts them (a last line without a newline
    counts), or rows of a Parquet file; raises OSError or pyarrow's errors if unreadable."""
    path = Path(path)
    if is_parquet(path):
        import pyarrow.parquet as pq

        return int(pq.ParquetFile(path).metadata.num_rows)
    lines, last = 0, b"\n"
    with path.open("rb") as fh:
        while chunk := fh.read(_CHUNK):
            lines += chunk.count(b"\n")
            last = chunk[-1:]
    return lines + (last != b"\n")


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


def check_before_server(
    config: PipelineConfig, partitions: list[str] | None, sizes: dict[str, int] | None = None
) -> RunCheck:
    """Check names, inputs, tokenizer and special tokens; raise the first kind that fails.

    Raises ConfigError (unknown partition), InputFileError (every unusable input, one line
    each), TokenizerError (tokenizer, chat template or a special token). ``sizes``, if given,
    is filled with each readable input's line count as it is found, so a caller reporting a
    failed check still knows the partitions' sizes.
    """
    names = list(partitions or [p.name for p in config.partitions])
    parts = [config.partition(name) for name in names]  # ConfigError names the unknown one
    sizes = {} if sizes is None else sizes
    problems: list[str] = []
    for part in parts:
        result = input_problem(part.name, part.input)
        if isinstance(result, str):
            problems.append(result)
        else:
            sizes[part.name] = result
    if problems:
        raise InputFileError("; ".join(problems))
    tokenizer = load_tokenizer(config)
    ids = TokenIds.resolve(tokenizer, config.special_tokens)
    return RunCheck(names=names, sizes=sizes, tokenizer=tokenizer, ids=ids)
