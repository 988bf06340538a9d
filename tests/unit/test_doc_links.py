"""Every relative link in README.md and docs/*.md leads to a file of the repository: a guide
that moved or a page that was renamed breaks a test, not a reader's click."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LINK = re.compile(r"!?\[[^\]]*\]\(([^()\s]+)(?:\s+\"[^\"]*\")?\)")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)
CODE_SPAN = re.compile(r"`[^`\n]*`")


def relative_links(markdown: str) -> list[str]:
    """The targets of the markdown links and images outside code, without URLs and anchors."""
    prose = CODE_SPAN.sub("", FENCE.sub("", markdown))
    targets = [m.group(1) for m in LINK.finditer(prose)]
    return [t.split("#", 1)[0] for t in targets if not re.match(r"[a-z][a-z0-9+.-]*:|#", t)]


def documents() -> list[Path]:
    return [
        ROOT / "README.md",
        *sorted((ROOT / "docs").glob("*.md")),
        ROOT / "trainers/lab/RESULTS.md",
    ]


def test_relative_links_finds_links_and_images_outside_code() -> None:
    text = (
        "See [ops](docs/operations.md#a-nightly-run) and ![run](docs/img/run.png).\n"
        "Not [this](https://example.org/x.md), [an anchor](#layout), `[code](nowhere.md)`.\n"
        "```\n[in a block](nowhere.md)\n```\n"
    )
    assert relative_links(text) == ["docs/operations.md", "docs/img/run.png"]


@pytest.mark.parametrize("doc", documents(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_relative_link_resolves_to_a_file(doc: Path) -> None:
    links = relative_links(doc.read_text())
    broken = [
        link
        for link in links
        if not (target := (doc.parent / link).resolve()).is_file() or ROOT not in target.parents
    ]
    assert not broken, f"{doc.relative_to(ROOT)}: links to no file of the repository: {broken}"


def test_the_readme_links_to_its_guides() -> None:
    """The README is a guide to docs/: if its links went away, the test above checks nothing."""
    assert len(relative_links((ROOT / "README.md").read_text())) >= 10
