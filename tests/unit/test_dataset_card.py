"""The dataset card: partitions in the config's order with its first as the default, every column
documented, and "first written" the first run's time however many runs followed."""

from __future__ import annotations

import copy
import re
from pathlib import Path

import pyarrow.parquet as pq

from eagle3_datagen.report.dataset_card import refresh_dataset_card
from eagle3_datagen.write.manifest import summarize_on_disk, update_manifest
from tests.support.dataset import (
    Batch,
    Tok,
    make_config,
    make_fingerprint,
    write_dataset,
    write_partition,
)


def test_card_after_two_runs(tmp_path: Path, chat_tokenizer: object) -> None:
    config = make_config(("zeta", "alpha"))  # the config's order is not the sorted order
    first = make_fingerprint(config, chat_tokenizer)  # type: ignore[arg-type]
    first["run"]["created_at"] = "2026-11-29T01:00:00+00:00"
    t = Tok(chat_tokenizer)  # type: ignore[arg-type]
    write_dataset(tmp_path, first, {"zeta": [Batch([t.record("z1", "zeta", line=1)])]})
    (tmp_path / "manifest.json").unlink()  # as the first run leaves it: via update_manifest
    update_manifest(tmp_path, first, {"zeta": summarize_on_disk(tmp_path, "zeta")})
    # The next night adds the other partition to the same data.
    second = copy.deepcopy(first)
    second["run"]["created_at"] = "2026-11-30T01:00:00+00:00"
    write_partition(tmp_path, "alpha", [Batch([t.record("a1", "alpha", line=1)])], second)
    manifest = update_manifest(
        tmp_path,
        second,
        {n: summarize_on_disk(tmp_path, n) for n in ("zeta", "alpha")},
    )
    assert manifest["first_written"] == "2026-11-29T01:00:00+00:00"

    refresh_dataset_card(tmp_path, manifest)
    text = (tmp_path / "README.md").read_text()
    assert "| first written | `2026-11-29T01:00:00+00:00` |" in text
    assert "| last run started | `2026-11-30T01:00:00+00:00` |" in text
    front = text.split("---\n")[1]
    assert front.index("config_name: zeta") < front.index("config_name: alpha")
    import yaml

    configs = {c["config_name"]: c for c in yaml.safe_load(front)["configs"]}
    assert configs["zeta"]["default"] is True and "default" not in configs["alpha"]
    assert 'load_dataset("' in text and '", "zeta", split="train")' in text

    import datasets

    default = datasets.load_dataset(str(tmp_path), split="train")
    assert default["id"] == ["z1"]

    # Every column of the shards on disk is documented, in the Columns section.
    columns = text.split("## Columns")[1].split("## Provenance")[0]
    documented = re.findall(r"^\| `(\w+)` \| (.+) \|$", columns, flags=re.M)
    on_disk = pq.read_schema(next((tmp_path / "zeta").glob("part-*.parquet"))).names
    assert [name for name, _ in documented] == on_disk
    # 20, has_tools, has_tool_results, user_turns, mode, 6 spec, 5 logprob
    assert len(on_disk) == 35
    assert all(len(doc.strip()) > 10 for _, doc in documented)


def test_a_run_under_new_settings_starts_a_new_first_written(
    tmp_path: Path, chat_tokenizer: object
) -> None:
    config = make_config(("p1",))
    old = make_fingerprint(config, chat_tokenizer)  # type: ignore[arg-type]
    old["run"]["created_at"] = "2026-11-01T00:00:00+00:00"
    update_manifest(tmp_path, old, {})
    config.sampling.temperature = 0.5
    new = make_fingerprint(config, chat_tokenizer)  # type: ignore[arg-type]
    assert update_manifest(tmp_path, new, {})["first_written"] == new["run"]["created_at"]


def test_the_manifest_and_its_card_are_written_together(
    tmp_path: Path, chat_tokenizer: object
) -> None:
    """However a run was started, the call that writes its manifest leaves the card with it."""
    from eagle3_datagen.report.dataset_card import write_manifest_and_card

    config = make_config(("zeta",))
    fingerprint = make_fingerprint(config, chat_tokenizer)  # type: ignore[arg-type]
    t = Tok(chat_tokenizer)  # type: ignore[arg-type]
    write_dataset(tmp_path, fingerprint, {"zeta": [Batch([t.record("z1", "zeta", line=1)])]})
    (tmp_path / "manifest.json").unlink()
    assert not (tmp_path / "README.md").exists()
    written = write_manifest_and_card(
        tmp_path, fingerprint, {"zeta": summarize_on_disk(tmp_path, "zeta")}
    )
    assert written.card_error is None and written.manifest["status"] == "completed"
    assert set(written.pictures) == {"zeta"}
    card = (tmp_path / "README.md").read_text()
    assert "config_name: zeta" in card and 'load_dataset("' in card
