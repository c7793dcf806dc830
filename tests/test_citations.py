"""Every citation in code, tests, benchmarks, scripts, docs and notebooks points inside the repository.

A contributor must be able to follow every reference: `docs/X.md#heading` must name a page of
docs/ and one of its headings, a bare `§N` in a docs page must name a numbered heading of that
page, and nothing may cite the design brief or the upstream specs that live outside the
repository (they are restated in docs/, in the project's own words).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from test_docs_links import anchors

REPO = Path(__file__).parents[1]
SCANNED = [
    *sorted((REPO / "trace_tools").rglob("*")),
    *sorted((REPO / "tests").rglob("*.py")),
    *sorted((REPO / "benchmarks").rglob("*.py")),
    *sorted((REPO / "scripts").rglob("*.py")),
    *sorted((REPO / "docs").rglob("*")),
    *sorted((REPO / "notebooks").glob("*.ipynb")),
    REPO / "README.md",
    REPO / "pyproject.toml",
    REPO / "sample_traces" / "README.md",
]
TEXT_SUFFIXES = {".py", ".md", ".ipynb", ".toml", ".yml", ".yaml", ".j2", ".js", ".css", ".html", ".txt", ".cfg"}

# Documents that are not in the repository: the design brief, the upstream specs, the seed
# documents and the shared folders that hold them.
OUTSIDE = re.compile(
    r"\bDESIGN\b|\breference/[\w.-]+\.md|(?:\.\./|/work/)shared\b|\bshared/(?:docs|seeds)\b|\b[Ss]eeds? 00\d"
)
DOCS_POINTER = re.compile(r"\bdocs/([\w.-]+\.md)(?:#([\w-]+))?")
SECTION = re.compile(r"§\s*([\w.]+)")
MARKDOWN_LINK = re.compile(r"\[[^\]]*\]\([^)\s]*\)")
# `§` in code only where it is text a generator writes into the docs page that resolves it.
SECTION_IN_CODE_ALLOWED = {
    "scripts/gen_docs.py": "upstream form → path (§1)",  # a column of docs/upstream_families.md's table
}


def cited_files() -> list[Path]:
    """Every text file scanned, but this one (its checker tests cite broken targets on purpose)."""
    return [
        p
        for p in SCANNED
        if p.is_file() and p.suffix in TEXT_SUFFIXES and "__pycache__" not in p.parts and p != Path(__file__)
    ]


def numbered_headings(page: Path) -> set[str]:
    """The numbers of a page's numbered headings (`## 3. ...` gives "3")."""
    return {m.group(1) for m in re.finditer(r"(?m)^#+ (\d+(?:\.\d+)*)\.? ", page.read_text())}


def citation_problems(text: str, where: Path, repo: Path = REPO) -> list[str]:
    """What is wrong with the citations in `text`, read as the file `where` of `repo`."""
    problems = [f"cites a document outside the repository: {m.group(0)!r}" for m in OUTSIDE.finditer(text)]
    for m in DOCS_POINTER.finditer(text):
        page, fragment = repo / "docs" / m.group(1), m.group(2)
        if not page.is_file():
            problems.append(f"{m.group(0)}: no such page")
        elif fragment and fragment not in anchors(page):
            problems.append(f"{m.group(0)}: {m.group(1)} has no heading #{fragment}")
    problems += section_problems(text, where, repo)
    return problems


def section_problems(text: str, where: Path, repo: Path) -> list[str]:
    """A bare `§N`: in a docs page it must be one of the page's numbered headings; in code, none."""
    relative = where.relative_to(repo).as_posix()
    if where.suffix != ".md":
        allowed = SECTION_IN_CODE_ALLOWED.get(relative)
        text = text.replace(allowed, "") if allowed else text
        return [f"section sign without a page: {m.group(0)!r}" for m in SECTION.finditer(text)]
    own = numbered_headings(where)
    unlinked = MARKDOWN_LINK.sub("", text)
    return [
        f"{m.group(0)!r} is not a numbered heading of this page"
        for m in SECTION.finditer(unlinked)
        if m.group(1).rstrip(".") not in own
    ]


@pytest.mark.parametrize("path", cited_files(), ids=lambda p: p.relative_to(REPO).as_posix())
def test_every_citation_points_inside_the_repository(path):
    problems = citation_problems(path.read_text(), path)
    assert not problems, f"{path.relative_to(REPO)}: " + "; ".join(problems)


def test_the_scan_covers_code_tests_and_docs():
    names = {p.relative_to(REPO).as_posix() for p in cited_files()}
    for expected in ("trace_tools/io/schema.py", "tests/conftest.py", "docs/metrics.md", "README.md"):
        assert expected in names


def _repo_with_docs(tmp_path: Path) -> Path:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "metrics.md").write_text("# Metrics\n\n## Per turn\n\n## 2. Numbered part\n")
    return tmp_path


def test_checker_accepts_a_pointer_to_an_existing_heading(tmp_path):
    repo = _repo_with_docs(tmp_path)
    code = repo / "module.py"
    assert citation_problems('"""Counted per turn (docs/metrics.md#per-turn)."""', code, repo) == []
    assert citation_problems("see docs/metrics.md", code, repo) == []


def test_checker_catches_a_broken_anchor_and_a_missing_page(tmp_path):
    repo = _repo_with_docs(tmp_path)
    code = repo / "module.py"
    assert citation_problems("(docs/metrics.md#per-session)", code, repo) == [
        "docs/metrics.md#per-session: metrics.md has no heading #per-session"
    ]
    assert citation_problems("(docs/metric.md#per-turn)", code, repo) == ["docs/metric.md#per-turn: no such page"]


def test_checker_catches_documents_outside_the_repository(tmp_path):
    repo = _repo_with_docs(tmp_path)
    code = repo / "module.py"
    for outside in (
        "DESIGN" + " §3",
        "the " + "DESIGN taxonomy",
        "reference" + "/miles_uniagent.md",
        "../" + "shared/x",
        "seed" + " 001",
    ):
        problems = citation_problems(f"# as {outside} says", code, repo)
        assert problems and "outside the repository" in problems[0], outside


def test_checker_allows_a_section_sign_only_for_the_pages_own_numbered_headings(tmp_path):
    repo = _repo_with_docs(tmp_path)
    page = repo / "docs" / "metrics.md"
    assert citation_problems("as §2 says", page, repo) == []
    assert citation_problems("as [there](other.md#x) §9 says", page, repo) == [
        "'§9' is not a numbered heading of this page"
    ]
    assert citation_problems("matchers (§2.3)", repo / "module.py", repo) == ["section sign without a page: '§2.3'"]
