"""The harness and import-format records are the only lists of harnesses and formats.

`trace_tools/probe/harnesses.py` and `trace_tools/importers/formats.py` hold one record each;
the CLI help, docs/probe.md and docs/importers.md, `import_traces` and `.ci/run` read them. These
tests check each view against the records, that `.ci/run` reads the pin with nothing but the
standard library, and that no other module or page keeps its own table of them.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
from pathlib import Path

import pytest
from tests.test_gen_docs import load_script
from typer.testing import CliRunner

from trace_tools.cli.main import app
from trace_tools.errors import UsageError
from trace_tools.importers import import_traces
from trace_tools.importers.formats import FORMATS, ImportFormat
from trace_tools.probe.harnesses import HARNESSES, Launch, describe, harness_dir

REPO = Path(__file__).resolve().parents[1]
RECORD_MODULES = {REPO / "trace_tools" / "probe" / "harnesses.py", REPO / "trace_tools" / "importers" / "formats.py"}
NAME_SETS = {"harness": set(HARNESSES), "import format": set(FORMATS)}
LAUNCH = Launch("fix the bug", "http://127.0.0.1:8642/s/s00", Path("/scratch/home"), Path("/scratch/repo"))


def _help(*command: str) -> str:
    result = CliRunner().invoke(app, [*command, "--help"], env={"COLUMNS": "400"})
    assert result.exit_code == 0, result.output
    return " ".join(result.output.split())


# -- the harnesses ------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(HARNESSES))
def test_a_harness_gets_the_base_its_quiet_switches_and_its_credentials_and_nothing_inherited(name, monkeypatch):
    harness = HARNESSES[name]
    monkeypatch.setenv("ANTHROPIC_API_KEY", "a-real-key-from-the-caller")
    monkeypatch.setenv("OPENAI_API_KEY", "a-real-key-from-the-caller")
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.example:3128")
    env = harness.environment(LAUNCH)
    assert harness.quiet.items() <= env.items()
    assert {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/scratch/home", "NO_PROXY": "*"}.items() <= env.items()
    assert "HTTPS_PROXY" not in env and "a-real-key-from-the-caller" not in env.values()
    assert any("dummy-key-not-valid" in value for value in env.values())
    argv = harness.command(Path("/h/bin/x"), LAUNCH)
    assert argv[0] == "/h/bin/x" and "fix the bug" in argv
    assert LAUNCH.base_url in " ".join([*argv, *env.values()])  # the recorder's session URL reaches the client


def test_ci_run_reads_the_pin_install_command_and_paths_from_the_record_without_third_party_packages(tmp_path):
    """The `.ci/run` lines run as written, with `python3 -S` (no site-packages) before any venv exists."""
    script = (REPO / ".ci" / "run").read_text()
    helper = re.search(r"^harness\(\) \{.*\}$", script, re.M)
    assert helper, ".ci/run no longer defines harness() reading the records"
    assert "-S" in helper.group(0).split() and "sed" not in script
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "TRACE_TOOLS_HARNESS_DIR": str(tmp_path / "h")}
    facts = {}
    for what in ("version", "install", "executable", "dir"):
        done = subprocess.run(
            ["bash", "-c", f"{helper.group(0)}\nharness claude-code {what}"],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
        )
        assert done.returncode == 0, done.stderr
        facts[what] = done.stdout.strip()
    claude = HARNESSES["claude-code"]
    assert facts["version"] == claude.version
    assert facts["install"] == claude.install.format(dir=tmp_path / "h", version=claude.version)
    assert facts["executable"] == str(tmp_path / "h" / f"claude-code-{claude.version}" / claude.executable)
    assert facts["dir"] == str(tmp_path / "h")


def test_ci_run_installs_every_harness_from_its_record():
    loop = re.search(r"^for name in (.*); do$", (REPO / ".ci" / "run").read_text(), re.M)
    assert loop, ".ci/run no longer loops over the harnesses it installs"
    assert sorted(loop.group(1).split()) == sorted(HARNESSES)


def test_describe_names_the_facts_it_knows_on_a_wrong_one(monkeypatch, tmp_path):
    monkeypatch.setenv("TRACE_TOOLS_HARNESS_DIR", str(tmp_path))
    assert describe("mini-swe-agent", "dir") == str(harness_dir()) == str(tmp_path)
    with pytest.raises(UsageError, match="choose one of: version, install, executable, dir"):
        describe("mini-swe-agent", "pin")


def test_probe_help_and_docs_name_every_harness_as_its_record_says():
    assert f"HARNESS: {' | '.join(HARNESSES)}" in _help("probe")
    page = (REPO / "docs" / "probe.md").read_text()
    for harness in HARNESSES.values():
        for variable in harness.quiet:  # the isolation section lists every switch the client gets
            assert f"`{variable}=" in page, f"docs/probe.md does not list {harness.name}'s {variable}"


# -- the import formats ------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(FORMATS))
def test_every_format_has_a_reader_a_docs_section_and_a_fixture(name):
    fmt = FORMATS[name]
    assert callable(fmt.load().outcomes)
    assert f"**`{name}`**" in (REPO / "docs" / "importers.md").read_text()
    fixtures = REPO / "tests" / "fixtures" / "import"
    assert any(path.name.endswith(fmt.suffixes) for path in fixtures.rglob("*"))


def test_import_help_lists_every_format_and_which_need_a_session_key():
    text = _help("import")
    for fmt in FORMATS.values():
        assert f"{fmt.name} ({fmt.written_by}: {fmt.reads})" in text
    needing = ", ".join(f.name for f in FORMATS.values() if f.needs_session_key)
    assert f"({needing}: required)" in text


def test_a_source_directory_contributes_only_the_formats_suffixes(tmp_path, monkeypatch):
    """The record's suffixes decide which files a directory gives: here a format that reads only `.ndjson`."""
    fixture = REPO / "tests" / "fixtures" / "import" / "gateway_traces.jsonl"
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "calls.ndjson").write_bytes(fixture.read_bytes())
    (tmp_path / "src" / "notes.jsonl").write_text("not json\n")  # would be a bad_json record if read
    narrow = ImportFormat("gateway-ndjson", reader="gateway", reads="-", written_by="-", suffixes=(".ndjson",))
    monkeypatch.setitem(FORMATS, narrow.name, narrow)
    report = import_traces(narrow.name, [tmp_path / "src"], tmp_path / "d.parquet")
    assert report.files == 1 and report.turns > 0 and report.quarantined_records == 0


# -- the docs tables and no second table --------------------------------------------------------------


@pytest.mark.parametrize("table", ["harnesses", "import-formats", "import-mapping", "import-list"])
def test_the_docs_tables_are_the_records(table):
    gen_docs = load_script()
    assert gen_docs.TABLES[table].build(None) == gen_docs.current(table), (
        f"rerun `python scripts/gen_docs.py --only {table}`"
    )


def _literals_naming_two(tree: ast.AST, names: set[str]) -> list[int]:
    """Lines of literals (collections, or one string such as a help text) naming two or more of `names`."""
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.List, ast.Tuple, ast.Set, ast.Dict)):
            items = node.keys if isinstance(node, ast.Dict) else node.elts
            found = {item.value for item in items if isinstance(item, ast.Constant) and item.value in names}
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            found = {name for name in names if re.search(rf"(?<![\w-]){re.escape(name)}(?![\w-])", node.value)}
        else:
            continue
        if len(found) >= 2:
            lines.append(node.lineno)
    return lines


def test_no_module_outside_the_records_lists_harnesses_or_formats():
    found = []
    for path in sorted([*(REPO / "trace_tools").rglob("*.py"), *(REPO / "scripts").rglob("*.py")]):
        if path in RECORD_MODULES:
            continue
        tree = ast.parse(path.read_text())
        for kind, names in NAME_SETS.items():
            found += [f"{path.relative_to(REPO)}:{line} lists {kind}s" for line in _literals_naming_two(tree, names)]
    assert found == []


def test_no_page_keeps_its_own_table_of_harnesses_or_formats():
    """A markdown table outside a generated block may not have two harnesses or two formats as rows."""
    found = []
    for page in sorted([REPO / "README.md", *(REPO / "docs").glob("*.md")]):
        text = re.sub(r"<!-- table:.*?<!-- /table -->", "", page.read_text(), flags=re.S)
        firsts = [line.split("|")[1].strip().strip("`") for line in text.splitlines() if line.startswith("| ")]
        for kind, names in NAME_SETS.items():
            if len(names & set(firsts)) >= 2:
                found.append(f"{page.relative_to(REPO)} has a table of {kind}s")
    assert found == []
