"""The layering of docs/architecture.md#layers, over every unit of the package: a module imports only units below its own.

The order, bottom up, is the "Layers" block of docs/architecture.md, which `LAYERS` must match
word for word. Function-level imports count, and so do `importlib.import_module` calls; within
one folder, no module imports itself back through others (no import circle).
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
    "arrow_pool",
    "collector",
    "process_pool",
    "data",
    "families",
    "io",
    "render",
    "pipeline",
    "reconstruct",
    "strategies",
    "report",
    "replay",
    "importers",
    "trainer",
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


def test_the_architecture_page_draws_the_same_layers():
    """docs/architecture.md's "Layers" block, bottom up, one line per layer: its units, then what they are."""
    page = (ROOT.parent / "docs" / "architecture.md").read_text()
    block = page.split("## Layers", 1)[1].split("```", 2)[1]
    drawn = [unit for line in block.strip().splitlines() for unit in line.split("  ", 1)[0].split(", ")]
    assert drawn == LAYERS


def _module_name(path: Path) -> str:
    """`trace_tools.strategies.base`; a package's own module is `trace_tools.strategies.__init__`."""
    return ".".join(path.relative_to(ROOT.parent).with_suffix("").parts)


MODULES = {_module_name(path) for path in ROOT.rglob("*.py")}


def _module(name: str) -> str | None:
    return name if name in MODULES else (f"{name}.__init__" if f"{name}.__init__" in MODULES else None)


def _targets(module: str, source: str) -> set[str]:
    """The package's modules that `module`'s imports load (at any level): `from P import X` names
    the module P.X where there is one, else P's `__init__`; relative imports are resolved."""
    package = module.rsplit(".", 1)[0].split(".")
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found |= {_module(alias.name) for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            above = package[: len(package) - node.level + 1] if node.level else []
            base = ".".join([*above, node.module or ""]).strip(".")
            found |= {_module(f"{base}.{alias.name}") or _module(base) for alias in node.names}
    return found - {None, module}


def _folder_graph(folder: str, imports: dict[str, set[str]]) -> dict[str, set[str]]:
    """Imports between the entries of one folder: its modules, and its subfolders (each standing
    for every module under it, so that a circle through a subpackage shows)."""

    def entry(module: str) -> str | None:
        return module[len(folder) + 1 :].split(".")[0] if module.startswith(f"{folder}.") else None

    graph: dict[str, set[str]] = {}
    for module, targets in imports.items():
        source = entry(module)
        if source is not None:
            graph.setdefault(source, set()).update({entry(t) for t in targets} - {None, source})
    return graph


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The sets of nodes that import one another, each sorted (nodes that reach each other)."""

    def reach(start: str) -> set[str]:
        seen, stack = set(), [*graph.get(start, ())]
        while stack:
            node = stack.pop()
            if node not in seen:
                seen.add(node)
                stack += graph.get(node, ())
        return seen

    reached = {node: reach(node) for node in graph}
    circles = {frozenset(o for o in reached[n] if n in reached.get(o, ())) for n in graph if n in reached[n]}
    return sorted(sorted(circle) for circle in circles)


def test_no_folder_holds_an_import_circle():
    """A circle works only by the order modules happen to load in, and hides which one is the base."""
    paths = {_module_name(path): path for path in ROOT.rglob("*.py")}
    imports = {module: _targets(module, path.read_text()) for module, path in paths.items()}
    folders = {module.rsplit(".", 1)[0] for module in paths}
    found = {folder: _circles(_folder_graph(folder, imports)) for folder in sorted(folders)}
    assert {folder: circles for folder, circles in found.items() if circles} == {}


def test_the_circle_finder_sees_function_level_and_relative_imports():
    source = "from . import declarations\ndef f():\n    from trace_tools.strategies.builtin import BUILTIN\n"
    base = "trace_tools.strategies.base"
    assert _targets(base, source) == {"trace_tools.strategies.declarations", "trace_tools.strategies.builtin"}
    assert _targets(base, "from trace_tools.pipeline import Pipeline\n") == {"trace_tools.pipeline.__init__"}
    graph = {"base": {"builtin"}, "builtin": {"tree"}, "tree": {"base", "core"}, "core": set()}
    assert _circles(graph) == [["base", "builtin", "tree"]]
    assert _circles({**graph, "tree": {"core"}}) == []


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
