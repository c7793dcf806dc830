"""README and docs/ link only to files of this repository that exist, and to headings they have.

Citations of documents outside the repository, in docs and code alike: tests/test_citations.py.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).parents[1]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def anchor(heading: str) -> str:
    """The fragment GitHub gives a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower().replace("`", ""))
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.S | re.M)  # fenced blocks, not inline ```
    return {anchor(m.group(1)) for m in re.finditer(r"(?m)^#+ (.+)$", text)}


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_links_stay_in_the_repository_and_resolve(page):
    for target in LINK.findall(page.read_text()):
        assert "://" not in target and not target.startswith("mailto:"), f"{page.name}: {target} leaves the repository"
        path, _, fragment = target.partition("#")
        resolved = (page.parent / path).resolve() if path else page
        assert resolved.is_relative_to(REPO) and resolved.exists(), f"{page.name}: {target} does not exist"
        if fragment and resolved.suffix == ".md":
            assert fragment in anchors(resolved), f"{page.name}: {target}: no such heading"


def test_every_docs_page_is_reachable_from_the_readme():
    linked = {REPO / "README.md"}
    frontier = [REPO / "README.md"]
    while frontier:
        page = frontier.pop()
        for target in LINK.findall(page.read_text()):
            path = (page.parent / target.partition("#")[0]).resolve()
            if path.suffix == ".md" and path.exists() and path not in linked:
                linked.add(path)
                frontier.append(path)
    orphans = [p.name for p in PAGES if p.resolve() not in linked]
    assert not orphans, f"docs pages no link leads to from the README: {orphans}"
