"""A finished dataset read back from disk: manifest, committed shards, the run's own settings.

The offline tools (``eagle3-datagen validate`` and ``export``) start here. They trust only what
a commit marker vouches for (a shard without one is a batch that never finished), read one
shard at a time (never the whole dataset), and take the special tokens and validation policy
from the manifest's fingerprint, so a dataset is checked by the rules it was made under.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import orjson
import pyarrow as pa
import pyarrow.parquet as pq
from pydantic import BaseModel, ValidationError

from eagle3_datagen.config import SpecialTokens, ValidationPolicy, format_validation_error
from eagle3_datagen.errors import DatasetError, TokenizerError
from eagle3_datagen.render.chat_tokenizer import ChatTokenizer
from eagle3_datagen.render.token_ids import TokenIds
from eagle3_datagen.write.manifest import MANIFEST
from eagle3_datagen.write.shards import BatchSummary, PartitionOutput

M = TypeVar("M", bound=BaseModel)
CONTENT_SHA_KEY = b"eagle3_datagen.content_sha256"
_SHARD_NAME = re.compile(r"^part-(\d+)\.parquet$")
# The tokenizer must be the one the data was made with; the chat template may differ (it
# only shaped prompts that are already rendered).
_TOKENIZER_KEYS = ("vocab_sha256", "special_tokens_sha256")


@dataclass(frozen=True, slots=True)
class Shard:
    """One committed batch: its records, its rejects (None when it had none), its marker."""

    partition: str
    index: int
    path: Path
    rejects_path: Path | None
    marker: BatchSummary


class DatasetDir:
    """An output directory with a manifest; raises DatasetError when it cannot be read."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        self.manifest_path = self.root / MANIFEST
        try:
            manifest = orjson.loads(self.manifest_path.read_bytes())
        except FileNotFoundError:
            raise DatasetError(
                f"{self.manifest_path}: no manifest; is {self.root} an eagle3-datagen output?"
            ) from None
        except (OSError, orjson.JSONDecodeError) as err:
            raise DatasetError(f"{self.manifest_path}: cannot read manifest: {err}") from None
        fp = manifest.get("fingerprint") if isinstance(manifest, dict) else None
        if not isinstance(fp, dict) or not isinstance(fp.get("content"), dict):
            raise DatasetError(f"{self.manifest_path}: no fingerprint.content in the manifest")
        if not fp.get("content_sha256"):
            raise DatasetError(f"{self.manifest_path}: no fingerprint.content_sha256")
        self.manifest: dict[str, Any] = manifest
        self.fingerprint: dict[str, Any] = fp
        self.content: dict[str, Any] = fp["content"]
        self.run: dict[str, Any] = fp.get("run") or {}
        self.content_sha256: str = str(fp["content_sha256"])

    # -- settings recovered from the fingerprint ------------------------------------------

    def _settings(self, key: str, cls: type[M]) -> M:
        try:
            return cls.model_validate(self.content.get(key, {}))
        except ValidationError as err:
            where = f"{self.manifest_path} (fingerprint.content.{key})"
            raise DatasetError(format_validation_error(err, where)) from None

    @property
    def special_tokens(self) -> SpecialTokens:
        return self._settings("special_tokens", SpecialTokens)

    @property
    def policy(self) -> ValidationPolicy:
        return self._settings("validation", ValidationPolicy)

    def load_tokenizer(self, override: str | None = None) -> ChatTokenizer:
        """The run's tokenizer (or ``override``), refused if its vocabulary differs."""
        recorded = self.run.get("tokenizer_path")
        path = override or recorded
        if not path:
            raise DatasetError(
                f"{self.manifest_path}: fingerprint.run.tokenizer_path is missing; "
                "pass --tokenizer PATH"
            )
        # The render reference the dataset was made with; datasets from before it was recorded
        # were rendered through the template as-is.
        render: Any = self.content.get("render") or "template"  # ChatTokenizer checks it
        try:
            tok = ChatTokenizer(str(path), render=render)
        except TokenizerError as err:
            hint = "" if override else " (the dataset may have moved machines: pass --tokenizer)"
            raise DatasetError(f"{err}{hint}") from None
        expected = self.content.get("tokenizer") or {}
        got = tok.fingerprint()
        differ = [k for k in _TOKENIZER_KEYS if expected.get(k) and expected[k] != got[k]]
        if differ:
            raise DatasetError(
                f"tokenizer at {path!r} is not the one {self.manifest_path} was made with "
                f"({', '.join(differ)} differ)"
            )
        return tok

    def token_ids(self, tokenizer_override: str | None = None) -> TokenIds:
        return TokenIds.resolve(self.load_tokenizer(tokenizer_override), self.special_tokens)

    # -- partitions and shards -----------------------------------------------------------

    def partitions(self) -> list[str]:
        """Partitions of the manifest, then any on disk that the manifest does not name."""
        named = list((self.manifest.get("partitions") or {}).keys())
        on_disk = sorted(
            p.name for p in self.root.iterdir() if (p / "_batches").is_dir() and p.name not in named
        )
        return named + on_disk

    def manifest_entry(self, partition: str) -> dict[str, Any] | None:
        entry = (self.manifest.get("partitions") or {}).get(partition)
        return entry if isinstance(entry, dict) else None

    def shards(self, partition: str) -> tuple[list[Shard], list[str]]:
        """Committed shards in batch order, and problems: uncommitted or missing shards."""
        out = PartitionOutput(self.root, partition)
        problems: list[str] = []
        markers: dict[int, BatchSummary] = {}
        for path in sorted(out.markers_dir.glob("*.json")):
            try:
                marker = BatchSummary.from_json(orjson.loads(path.read_bytes()))
            except (OSError, orjson.JSONDecodeError, TypeError) as err:
                problems.append(f"{path}: unreadable commit marker: {err}")
                continue
            markers[marker.index] = marker
        on_disk: dict[int, Path] = {}
        for path in out.shard_paths():
            m = _SHARD_NAME.match(path.name)
            if m:
                on_disk[int(m.group(1))] = path
        for index in sorted(set(on_disk) - set(markers)):
            problems.append(
                f"{on_disk[index]}: uncommitted shard (its batch has no commit marker); "
                "it is not part of the dataset: rerun the pipeline to finish it"
            )
        shards: list[Shard] = []
        for index, marker in sorted(markers.items()):
            if index not in on_disk:
                problems.append(
                    f"{out.marker_path(index)}: batch committed but its shard is missing"
                )
                continue
            rejects = out.rejects_path(index)
            shards.append(
                Shard(
                    partition, index, on_disk[index], rejects if rejects.exists() else None, marker
                )
            )
        return shards, problems

    def check_fingerprint(self, path: Path) -> str | None:
        """Why the file does not belong to this dataset, or None when it does."""
        try:
            meta = pq.read_schema(path).metadata or {}
        except (pa.ArrowException, OSError) as err:
            return f"{path}: not a readable Parquet file: {err}"
        got = meta.get(CONTENT_SHA_KEY)
        if got is None:
            return f"{path}: no {CONTENT_SHA_KEY.decode()} metadata (not written by this pipeline)"
        if got.decode() != self.content_sha256:
            return (
                f"{path}: made under fingerprint {got.decode()[:12]}, but {self.manifest_path} "
                f"is {self.content_sha256[:12]}: data of another run is mixed in"
            )
        return None


def iter_rows(
    path: Path, columns: Sequence[str], batch_rows: int = 1024
) -> Iterator[dict[str, Any]]:
    """Rows of one Parquet file, ``batch_rows`` at a time; errors name the file."""
    try:
        pf = pq.ParquetFile(path)
        for batch in pf.iter_batches(batch_size=batch_rows, columns=list(columns)):
            yield from batch.to_pylist()
    except (pa.ArrowException, OSError, KeyError) as err:
        raise DatasetError(f"{path}: cannot read: {err}") from None
