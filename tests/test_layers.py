"""The layering of docs/architecture.md#layers, over every unit of the package: a module imports only units below its own.

The order, bottom up: the shared vocabulary (errors, ids, memo, options, data), the model-family
records (families: data only, read by every layer), then the pipeline
(io, render, pipeline, reconstruct), replay (strategies, replay), what reads a run (report), the
commands that make or rework dumps (importers, rescore, simulate, record), and the front ends
(api, probe, cli). Function-level imports count, and so do `importlib.import_module` calls.
"""

from __future__ import annotations

import ast
from pathlib import Path

import trace_tools

LAYERS = [
    "errors",
    "ids",
    "memo",
    "options",
    "data",
    "families",
    "io",
    "render",
    "pipeline",
    "reconstruct",
    "strategies",
    "replay",
    "report",
    "importers",
    "rescore",
    "simulate",
    "record",
    "api",
    "probe",
    "cli",
]
ROOT = Path(trace_tools.__file__).parent


def _unit(path: Path) -> str:
    return path.relative_to(ROOT).parts[0].removesuffix(".py")


def _imported(tree: ast.AST) -> list[str]:
    """The trace_tools modules a module names in its imports (relative ones resolved to `trace_tools.`)."""
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            names.append(node.module or "" if not node.level else "trace_tools.<relative>")
        elif isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) == "import_module":
            first = node.args[0] if node.args else None
            first = first.values[0] if isinstance(first, ast.JoinedStr) and first.values else first
            if isinstance(first, ast.Constant) and isinstance(first.value, str):
                names.append(first.value)
    return names


def _upward(unit: str, source: str) -> list[str]:
    """The imports of a module of `unit` that name a unit above it (or no known unit)."""
    found = []
    for name in _imported(ast.parse(source)):
        parts = name.split(".")
        if parts[0] != "trace_tools" or len(parts) < 2 or not parts[1] or parts[1] == unit:
            continue
        if parts[1] not in LAYERS or LAYERS.index(parts[1]) > LAYERS.index(unit):
            found.append(name)
    return found


def test_every_unit_imports_only_units_below_it():
    violations = []
    for path in sorted(ROOT.rglob("*.py")):
        if _unit(path) == "__init__":
            continue  # the package's lazy attribute table names the API, at every level
        violations += [f"{path.relative_to(ROOT)} imports {name}" for name in _upward(_unit(path), path.read_text())]
    assert violations == []


def test_every_unit_of_the_package_has_a_layer():
    units = {_unit(path) for path in ROOT.rglob("*.py")} - {"__init__"}
    assert units == set(LAYERS)


def test_function_level_and_importlib_imports_count():
    """The way the rescore → simulate loop hid: an import inside a function."""
    source = (
        "from trace_tools.io import storage\n"
        "def f():\n"
        "    from trace_tools.simulate import HARNESS\n"
        "    importlib.import_module(f'trace_tools.cli.{name}')\n"
        "    from . import sibling\n"
    )
    assert sorted(_upward("rescore", source)) == ["trace_tools.<relative>", "trace_tools.cli.", "trace_tools.simulate"]
    assert _upward("cli", source) == ["trace_tools.<relative>"]


def test_every_package_is_installed():
    """`pip install .` ships only the packages pyproject.toml lists: a new subpackage must be listed."""
    import tomllib

    listed = set(tomllib.loads((ROOT.parent / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {".".join(path.parent.relative_to(ROOT.parent).parts) for path in ROOT.rglob("__init__.py")}
    assert found - listed == set()


MODULE_LINES = 660  # "no module over about 600 lines" (issue 24): one job per module


def test_no_module_grows_past_one_job():
    """A module past this size does several jobs; split it along its seams instead (the tokenizer
    into recipes, files and fast encoder; io.load into dump files, id columns and the stream)."""
    sizes = {str(path.relative_to(ROOT)): len(path.read_text().splitlines()) for path in ROOT.rglob("*.py")}
    assert {name: lines for name, lines in sizes.items() if lines > MODULE_LINES} == {}
