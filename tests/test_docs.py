"""The documentation's shape: a README that reads in five minutes, every doc reachable from docs/index.md, and
no relative link (or its #anchor) that leads nowhere."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
README_MAX_LINES = 130


def linked_files() -> list[Path]:
    """The Markdown files whose relative links are checked: the README, docs/, bench/ and every package README."""
    return [REPO / "README.md", *sorted(DOCS.glob("*.md")), REPO / "bench" / "README.md",
            *sorted(REPO.glob("services/*/README.md")), REPO / "gateway" / "README.md"]


def relative_links(doc: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", doc.read_text(), flags=re.DOTALL)  # links inside code blocks are code
    return [t for t in LINK.findall(text) if not re.match(r"[a-z][a-z0-9+.-]*:", t)]


def anchors(doc: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces as dashes."""
    headings = re.findall(r"^#+\s+(.*)$", re.sub(r"```.*?```", "", doc.read_text(), flags=re.DOTALL), re.MULTILINE)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in headings}


def test_the_readme_reads_in_five_minutes() -> None:
    lines = (REPO / "README.md").read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines; move detail to docs/"
    assert "docs/index.md" in "\n".join(lines)


def test_every_doc_is_linked_from_the_index() -> None:
    index = DOCS / "index.md"
    linked = {(DOCS / target.split("#")[0]).resolve() for target in relative_links(index)}
    unlinked = [p.name for p in sorted(DOCS.glob("*.md")) if p != index and p.resolve() not in linked]
    assert not unlinked, f"docs/index.md does not link {unlinked}"


@pytest.mark.parametrize("doc", linked_files(), ids=lambda p: str(p.relative_to(REPO)))
def test_relative_links_resolve(doc: Path) -> None:
    broken = []
    for target in relative_links(doc):
        path, _, anchor = target.partition("#")
        file = (doc.parent / path).resolve() if path else doc
        if not file.exists() or (anchor and file.suffix == ".md" and anchor not in anchors(file)):
            broken.append(target)
    assert not broken, f"{doc.relative_to(REPO)}: links that lead nowhere: {broken}"
