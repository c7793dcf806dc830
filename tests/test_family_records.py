"""The family records (`trace_tools.families`) are the only table of model families.

Every view of them (template names, tokenizer recipes, vocabulary bounds, parsers, simulator
writers, miles' TITO table, the CLI help, the docs) must list exactly the records, and no other
module of the package may hold its own list of family names.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

import trace_tools
from trace_tools import families
from trace_tools.cli.main import app
from trace_tools.families import FAMILIES, TOKENIZERS

REPO = Path(__file__).parents[1]
RECORDS = Path(families.__file__)
# The Qwen tool-call formats are parsed by `render.parser` itself, not a registered parser.
QWEN_FORMATS = {"json", "xml"}


def _help(*command: str) -> str:
    """A command's `--help`, wide and with the panels' borders and line breaks folded away."""
    result = CliRunner().invoke(app, [*command, "--help"], env={"COLUMNS": "200", "NO_COLOR": "1"})
    assert result.exit_code == 0, result.output
    return re.sub(r"\s+", " ", re.sub(r"[│╭╮╰╯─]", " ", result.output))


# -- every derived table lists exactly the records ------------------------------------------------


def test_render_layer_tables_derive_from_the_records():
    from trace_tools.render.family_parsers import PARSERS
    from trace_tools.render.templates import NAMED_TEMPLATES, TOKENIZER_TEMPLATES
    from trace_tools.render.tokenizer_recipes import NO_PACKAGE, PACKAGED, RECIPES

    assert NAMED_TEMPLATES == {name: family.template for name, family in FAMILIES.items()}
    assert [*RECIPES, *PACKAGED] == list(TOKENIZERS)
    assert set(TOKENIZER_TEMPLATES.values()) == set(NO_PACKAGE) == {"glm4.5"}
    assert set(PARSERS) | QWEN_FORMATS == set(families.TOOL_FORMATS)


def test_vocabulary_bounds_are_the_tokenizer_records():
    from trace_tools.io.vocab import BUILTIN_VOCAB_SIZES

    assert BUILTIN_VOCAB_SIZES == {name: tokenizer.vocab_size for name, tokenizer in TOKENIZERS.items()}
    assert BUILTIN_VOCAB_SIZES["qwen3"] == 151_669 and BUILTIN_VOCAB_SIZES["deepseek-v3"] == 129_280


def test_simulator_and_miles_tables_derive_from_the_records():
    from trace_tools.simulate.formats import FAMILIES as SIMULATED
    from trace_tools.simulate.formats import WRITERS
    from trace_tools.strategies.declarations import TITO_FAMILIES
    from trace_tools.strategies.session_core.tito import FAMILIES as TITO

    assert list(SIMULATED) == list(FAMILIES) and set(WRITERS) == set(FAMILIES)
    for name, simulated in SIMULATED.items():
        record = FAMILIES[name]
        assert (simulated.tokenizer, simulated.reasoning, simulated.call_opener) == (
            record.tokenizer,
            record.reasoning,
            record.call_opener,
        )
    assert TITO_FAMILIES == tuple(TITO) == ("default", "qwen3", "qwen35", "glm47")
    assert [families.tito_family_of(name) for name in FAMILIES] == [
        "qwen3",
        "qwen35",
        "glm47",
        "default",
        "default",
        "default",
    ]


def test_each_spelling_names_one_family():
    """A family's name is no other family's alias, and a miles TITO key belongs to one family
    (glm4.5 = glm = glm47); families may share a tool-call format or a tokenizer."""
    for family in FAMILIES.values():
        others = FAMILIES.keys() - {family.name}
        assert family.tool_format not in others and (family.tito is None or family.tito.name not in others)
    tito_keys = [family.tito.name for family in FAMILIES.values() if family.tito]
    assert len(tito_keys) == len(set(tito_keys)) and families.TITO_DEFAULT.name not in tito_keys
    assert FAMILIES["glm4.5"].aliases == ("glm", "qwen3+glm4.5-specials", "glm47")
    assert sorted(families.DETECTION_ORDER) == sorted(FAMILIES)
    assert all(family.tokenizer in TOKENIZERS for family in FAMILIES.values())
    assert all(t.stand_in_for in FAMILIES for t in TOKENIZERS.values() if t.stand_in_for)


def test_markers_and_detection_order_single_out_each_family_template():
    from trace_tools.render.templates import trl_template_dir

    directory = trl_template_dir()
    if directory is None:
        pytest.skip("the trl templates are not installed")
    texts = {name: (directory / family.template).read_text(encoding="utf-8") for name, family in FAMILIES.items()}
    for name, text in texts.items():
        carrying = [other for other in families.DETECTION_ORDER if all(m in text for m in FAMILIES[other].markers)]
        assert carrying[:1] == [name], f"{FAMILIES[name].template} carries the markers of {carrying}"


# -- the CLI help and the docs --------------------------------------------------------------------


@pytest.mark.parametrize("command", ["simulate", "probe", "record"])
def test_family_options_list_every_family(command):
    listed = " | ".join(FAMILIES)
    assert listed in _help(command), f"`{command} --help` does not list {listed}"


@pytest.mark.parametrize("command", ["replay", "reconstruct", "validate", "import"])
def test_tokenizer_template_and_format_options_list_the_records(command):
    text = _help(*command.split())
    assert " | ".join(families.tokenizer_choices()) in text
    for stand_in in (t for t in TOKENIZERS.values() if t.stand_in_for):
        assert f"{stand_in.name} (a stand-in)" in text
    if command in ("replay", "reconstruct"):
        assert " | ".join(families.TOOL_FORMATS) in text
    if command == "replay":
        assert " / ".join([*FAMILIES, "trl:<name>"]) in text


def _markdown_table(text: str, header_start: str) -> list[list[str]]:
    """The rows of the Markdown table whose header row starts with `header_start`, cells unescaped."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header_start))
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        cells = re.split(r"(?<!\\)\|", line.strip())[1:-1]
        rows.append([cell.strip().replace("\\|", "|") for cell in cells])
    return rows


def _codes(cell: str) -> list[str]:
    return re.findall(r"`([^`]+)`", cell)


def test_model_families_doc_table_is_the_records():
    doc = (REPO / "docs" / "model_families.md").read_text(encoding="utf-8")
    rows = _markdown_table(doc, "| family | chat template")
    assert [_codes(row[0])[0] for row in rows] == list(FAMILIES)
    previous_stops: list[str] = []
    for row in rows:
        family = FAMILIES[_codes(row[0])[0]]
        stops = previous_stops if row[4] == "same" else _codes(row[4])
        assert _codes(row[1]) == [family.template]
        assert _codes(row[2]) == [family.tool_format]
        assert _codes(row[3])[0] == family.serving_parser.split()[0]
        assert tuple(stops) == family.stop_tokens
        assert row[5] == family.reasoning_note
        previous_stops = stops
    markers = doc[doc.index("The family is detected from the template text") :].split("\n\n")[0]
    for family in FAMILIES.values():
        assert all(f"`{marker}`" in markers for marker in family.markers), family.name
    assert f"`--tool-format {'|'.join(families.TOOL_FORMATS)}`" in doc


def test_tokenizer_doc_table_is_the_records():
    doc = (REPO / "docs" / "model_families.md").read_text(encoding="utf-8")
    for row in _markdown_table(doc, "| `--tokenizer` | source"):
        tokenizer = TOKENIZERS[_codes(row[0])[0]]
        assert int(row[2].split()[0].replace(",", "")) == tokenizer.vocab_size
        assert ("stand-in" in row[1]) == bool(tokenizer.stand_in_for)


def test_simulator_doc_lists_every_family():
    doc = (REPO / "docs" / "simulator.md").read_text(encoding="utf-8")
    assert f"--template {'|'.join(FAMILIES)}" in doc
    names = ", ".join(f"`{name}`" for name in list(FAMILIES)[:-1])
    assert f"`--template` takes {names} or `{list(FAMILIES)[-1]}`" in doc


# -- no other table of families -------------------------------------------------------------------

# Names that identify one family (tool formats such as `json` are ordinary words, so they are not scanned).
_FAMILY_NAMES = (
    set(FAMILIES)
    | set(TOKENIZERS)
    | {family.template for family in FAMILIES.values()}
    | {family.tito.name for family in FAMILIES.values() if family.tito}
)


def family_tables(source: str) -> list[tuple[int, list[str]]]:
    """(line, names) of each dict, tuple, list or set literal in `source` that holds 2+ family names."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Dict):
            items: list = list(node.keys)
        elif isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            items = node.elts
        else:
            continue
        names = [item.value for item in items if isinstance(item, ast.Constant) and item.value in _FAMILY_NAMES]
        if len(names) >= 2:
            found.append((node.lineno, names))
    return found


def test_the_scan_finds_a_family_table():
    assert family_tables('SIZES = {"qwen3": 1, "gpt-oss": 2}\nok = ("qwen3", "x")') == [(1, ["qwen3", "gpt-oss"])]


def test_no_family_table_outside_the_records():
    package = Path(trace_tools.__file__).parent
    sources = [*package.rglob("*.py"), *(REPO / "scripts").glob("*.py")]
    tables = [
        f"{path.relative_to(REPO)}:{line} {names}"
        for path in sources
        if path != RECORDS
        for line, names in family_tables(path.read_text(encoding="utf-8"))
    ]
    assert tables == [], "list the families in trace_tools/families.py and derive from it"
