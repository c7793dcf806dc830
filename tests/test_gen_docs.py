"""scripts/gen_docs.py: tables between markers are rewritten in place, and `--check` names the stale ones.

The tables' contents come from real replays, which CI checks by running the script itself
(`.ci/run`); here the builders are replaced by fixed text so the page machinery is tested alone.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).parents[1]


def load_script():
    spec = importlib.util.spec_from_file_location("gen_docs", REPO / "scripts" / "gen_docs.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["gen_docs"] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def gen(tmp_path, monkeypatch):
    module = load_script()
    (tmp_path / "page.md").write_text("intro\n\n<!-- table:t -->\n| a |\n|---|\n| 1 |\n<!-- /table -->\n\nafter\n")
    monkeypatch.setattr(module, "ROOT", tmp_path)
    monkeypatch.setattr(module, "TABLES", {"t": module.Table("page.md", lambda runs: "| a |\n|---|\n| 2 |")})
    return module


def test_check_names_a_stale_table_and_changes_nothing(gen, tmp_path, capsys):
    before = (tmp_path / "page.md").read_text()
    assert gen.main(["--check"]) == 1
    assert "page.md: table 't' no longer matches" in capsys.readouterr().err
    assert (tmp_path / "page.md").read_text() == before


def test_rendering_rewrites_only_between_the_markers_then_check_passes(gen, tmp_path):
    assert gen.main([]) == 0
    assert (tmp_path / "page.md").read_text() == (
        "intro\n\n<!-- table:t -->\n| a |\n|---|\n| 2 |\n<!-- /table -->\n\nafter\n"
    )
    assert gen.main(["--check"]) == 0


def test_every_generated_table_has_its_markers_in_its_page():
    module = load_script()
    for name, table in module.TABLES.items():
        assert module.block(name).search((REPO / table.page).read_text()), f"{table.page} lacks table {name}"
