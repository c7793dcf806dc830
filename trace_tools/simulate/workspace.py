"""A small fake Python repository that the simulated agent explores, edits and tests.

Keeping real file contents (rather than inventing every tool result independently) makes the
payloads consistent: an Edit's `old_string` is text the agent read earlier, a later Read shows
the edit, Grep finds the functions that exist. The code is deliberately a little untidy: some
blank lines keep their indentation and some statements end in spaces, which is exactly the
trailing whitespace a harness that right-strips string arguments destroys.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

PROJECTS = (
    "ledgerkit",
    "tinyrouter",
    "csvkit_lite",
    "feedparse",
    "taskqueue",
    "confmerge",
    "logslice",
    "unitconv",
    "mdtable",
    "semverx",
)
MODULES = ("parser", "records", "io_utils", "filters", "cli", "config", "formatting", "validate")
NOUNS = ("row", "entry", "token", "record", "header", "field", "segment", "item")
PLURALS = {"entry": "entries"}
VERBS = ("parse", "split", "load", "collect", "normalize", "group", "truncate", "count", "merge", "select")
ARGS = ("values", "text", "rows", "line", "items", "payload", "source", "chunk")
KEYS = ("kind", "owner", "status", "region", "bucket", "label")

# Function templates: lines, with one (correct, buggy) pair marked by a tuple. Slots: {f} name,
# {a} argument, {n} noun, {k} key, {num} a number, {sep} a separator.
TEMPLATES: tuple[tuple, ...] = (
    (
        "def {f}({a}, keep=None):",
        '    """Return the {ns} of `{a}` accepted by `keep` (all of them when keep is None)."""',
        "    result = []",
        "    for item in {a}:",
        ("        if keep is not None and not keep(item):", "        if keep is not None and keep(item):"),
        "            continue",
        "        result.append(item)",
        "    return result",
    ),
    (
        "def {f}({a}: str) -> list[str]:",
        '    """Split one {n} line into fields; empty trailing fields are kept."""',
        ('    fields = {a}.split("{sep}")', '    fields = {a}.rstrip("{sep}").split("{sep}")'),
        "    return [field.strip() for field in fields]",
    ),
    (
        "def {f}({a}, limit={num}):",
        '    """Cut `{a}` down to at most `limit` {ns}."""',
        ("    if len({a}) > limit:", "    if len({a}) >= limit:"),
        "        return {a}[:limit]",
        "    return {a}",
    ),
    (
        "def {f}(records):",
        '    """Group {n} records by their `{k}` field, in first-seen order."""',
        "    groups = {{}}",
        "    for record in records:",
        ('        key = record.get("{k}")', '        key = record.get("{k}", "")'),
        "        groups.setdefault(key, []).append(record)",
        "    return groups",
    ),
    (
        "def {f}({a}, default=0):",
        '    """Parse `{a}` as a non-negative {n} count, or return `default`."""',
        "    try:",
        "        value = int({a})",
        "    except (TypeError, ValueError):",
        "        return default",
        ("    return max(value, 0)", "    return max(value, 1)"),
    ),
    (
        "def {f}(path):",
        '    """Read the {n} file at `path` and return its non-comment lines."""',
        '    with open(path, encoding="utf-8") as handle:',
        "        lines = handle.read().splitlines()",
        (
            '    return [line for line in lines if line and not line.startswith("#")]',
            '    return [line for line in lines if not line.startswith("#")]',
        ),
    ),
)


@dataclass
class Function:
    path: str
    name: str
    first_line: str
    good: str  # the correct line of the marked pair
    bad: str  # its buggy twin
    noun: str


@dataclass
class Workspace:
    """The repository: file contents by path, the functions defined in them, the planted bug."""

    root: str
    package: str
    files: dict[str, str] = field(default_factory=dict)
    functions: list[Function] = field(default_factory=list)
    bug: Function | None = None
    verbose: bool = False  # long profile: whole-file reads and per-test pytest lines

    @property
    def planted_bug(self) -> Function:
        """The function that carries the planted bug (`build_workspace` always plants one)."""
        assert self.bug is not None, "the workspace has no planted bug"
        return self.bug

    def lines(self, path: str) -> list[str]:
        return self.files[path].split("\n")

    def module_paths(self) -> list[str]:
        return [p for p in self.files if "/tests/" not in p and p.endswith(".py")]

    def test_path(self, module_path: str) -> str:
        stem = module_path.rsplit("/", 1)[1]
        return f"{self.root}/tests/test_{stem}"

    def replace(self, path: str, old: str, new: str, after: str = "") -> int:
        """Apply an edit at the first match at or after the text `after`; returns its 1-based line."""
        text = self.files[path]
        at = text.find(old, max(text.find(after), 0) if after else 0)
        if at < 0:
            return 1
        self.files[path] = text[:at] + new + text[at + len(old) :]
        return text[:at].count("\n") + 1


def build_workspace(
    rng: random.Random, modules: tuple[int, int] = (3, 5), functions_per_module: tuple[int, int] = (3, 6)
) -> Workspace:
    """A repository of `modules` modules with `functions_per_module` functions each (inclusive
    ranges); one function carries the planted bug."""
    project = rng.choice(PROJECTS)
    ws = Workspace(root=f"/repo/{project}", package=project)
    taken: set[str] = set()
    for module in rng.sample(MODULES, rng.randint(*modules)):
        path = f"{ws.root}/src/{project}/{module}.py"
        functions = [_function(rng, path, taken) for _ in range(rng.randint(*functions_per_module))]
        ws.functions.extend(f for f, _ in functions)
        header = (
            f'"""{module.replace("_", " ").capitalize()} helpers for {project}."""\n'
            "from __future__ import annotations\n\n\n"
        )
        ws.files[path] = header + "\n\n".join(lines for _, lines in functions) + "\n"
    ws.bug = rng.choice(ws.functions)
    for function in ws.functions:  # every function starts correct except the planted bug
        if function is ws.bug:
            ws.replace(function.path, function.good, function.bad, after=function.first_line)
    for path in ws.module_paths():
        ws.files[ws.test_path(path)] = _test_module(rng, ws, path)
    return ws


def _function(rng: random.Random, path: str, taken: set[str]) -> tuple[Function, str]:
    template = rng.choice(TEMPLATES)
    slots: dict[str, Any] = {  # str.format slots: names and words, and one number
        "f": f"{rng.choice(VERBS)}_{plural(rng.choice(NOUNS))}",
        "a": rng.choice(ARGS),
        "n": rng.choice(NOUNS),
        "k": rng.choice(KEYS),
        "num": rng.choice((8, 16, 64, 100, 256)),
        "sep": rng.choice((",", ";", "|", "\\t")),
    }
    slots["ns"] = plural(slots["n"])
    while slots["f"] in taken:  # names stay unique so Grep and Edit hit one definition
        slots["f"] += f"_{rng.randint(2, 9)}"
    taken.add(slots["f"])
    out, good, bad = [], "", ""
    for index, line in enumerate(template):
        if isinstance(line, tuple):
            good, bad = line[0].format(**slots), line[1].format(**slots)
            out.append(good)
        else:
            out.append(line.format(**slots))
        if 1 < index < len(template) - 1 and rng.random() < 0.08:
            out.append(_untidy_blank(rng, out[-1]))
    if rng.random() < 0.15:
        out[-1] += " " * rng.randint(1, 3)  # a statement that ends in spaces
    return Function(path, slots["f"], out[0], good, bad, slots["n"]), "\n".join(out) + "\n"


def _untidy_blank(rng: random.Random, previous: str) -> str:
    """A blank line that keeps its indentation, as many editors leave it."""
    indent = len(previous) - len(previous.lstrip(" "))
    return " " * max(4, indent) if rng.random() < 0.7 else ""


def _test_module(rng: random.Random, ws: Workspace, path: str) -> str:
    module = path.rsplit("/", 1)[1][:-3]
    names = [f.name for f in ws.functions if f.path == path]
    lines = [f"from {ws.package}.{module} import {', '.join(names)}"]
    for name in names:
        lines += [
            "",
            "",
            f"def test_{name}_handles_empty_input():",
            f"    assert {name}([]) in ([], {{}}, 0, None)"
            if rng.random() < 0.5
            else f"    assert {name}('') is not None",
        ]
    return "\n".join(lines) + "\n"


def plural(noun: str) -> str:
    return PLURALS.get(noun, noun + "s")


def numbered(lines: list[str], first: int = 1) -> str:
    """Lines as `cat -n` prints them: right-aligned numbers, a tab, the line."""
    return "\n".join(f"{number:6d}\t{line}" for number, line in enumerate(lines, start=first))


def function_block(ws: Workspace, function: Function) -> tuple[int, list[str]]:
    """(1-based first line, lines) of a function as it currently stands in its file."""
    lines = ws.lines(function.path)
    start = next((i for i, line in enumerate(lines) if line == function.first_line), 0)
    end = start + 1
    while end < len(lines) and (lines[end].startswith(" ") or lines[end] == ""):
        end += 1
    while end > start + 1 and not lines[end - 1].strip():
        end -= 1
    return start + 1, lines[start:end]
