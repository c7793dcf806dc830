"""Tool results: what the harness sends back after running a call against the workspace.

Results follow the shapes real tools print (`cat -n` numbering for Read, `path:line:text` for
Grep, pytest's own summary lines for Bash) at realistic lengths, and writes change the workspace
so later reads see them.
"""

from __future__ import annotations

import random
from typing import Any, Callable

from trace_tools.simulate.workspace import Function, Workspace, numbered

WIDTH = 80


def run(ws: Workspace, call: Any, rng: random.Random) -> str:
    """Execute one call (an `episode.Call`) and return the tool message text."""
    return RUNNERS[call.name](ws, call.arguments, rng)


def _read(ws: Workspace, args: dict, rng: random.Random) -> str:
    path = args["file_path"]
    if path not in ws.files:
        return f"File does not exist: {path}"
    lines = ws.lines(path)
    if lines and lines[-1] == "":
        lines = lines[:-1]
    first = int(args.get("offset", 1))
    limit = int(args.get("limit", len(lines)))
    return numbered(lines[first - 1 : first - 1 + limit], first)


def _edit(ws: Workspace, args: dict, rng: random.Random) -> str:
    path = args["file_path"]
    line = ws.replace(path, args["old_string"], args["new_string"])
    lines = ws.lines(path)
    lo = max(line - 3, 1)
    snippet = numbered(lines[lo - 1 : lo + 8], lo)
    return f"Edited {path}. The lines around the change now read:\n{snippet}"


def _multi_edit(ws: Workspace, args: dict, rng: random.Random) -> str:
    for change in args["edits"]:
        ws.replace(args["file_path"], change["old_string"], change["new_string"])
    return f"Applied {len(args['edits'])} edits to {args['file_path']}."


def _write(ws: Workspace, args: dict, rng: random.Random) -> str:
    existed = args["file_path"] in ws.files
    ws.files[args["file_path"]] = args["content"]
    verb = "Overwrote" if existed else "Created"
    return f"{verb} {args['file_path']} ({args['content'].count(chr(10))} lines)."


def _bash(ws: Workspace, args: dict, rng: random.Random) -> str:
    command = args["command"].removeprefix(f"cd {ws.root} && ")
    if command.startswith("python -m pytest"):
        only = command.split()[3] if len(command.split()) > 4 else None
        return pytest_output(ws, rng, only)
    if command == "git status --short":
        return "\n".join(f" M {p[len(ws.root) + 1 :]}" for p in changed_paths(ws)) or "(no output)"
    paths = changed_paths(ws)
    rows = [
        f" {p[len(ws.root) + 1 :]} | {rng.randint(2, 14)} {'+' * rng.randint(1, 6)}{'-' * rng.randint(0, 3)}"
        for p in paths
    ]
    return "\n".join(rows + [f" {len(paths)} files changed"]) if paths else "(no output)"


def _grep(ws: Workspace, args: dict, rng: random.Random) -> str:
    hits = grep_hits(
        ws, args["pattern"].removeprefix("def ").strip(), definition_only=args["pattern"].startswith("def ")
    )
    if args.get("output_mode") == "content":
        return "\n".join(hits) or "No matches found"
    files = sorted({hit.split(":", 1)[0] for hit in hits})
    return (f"Found {len(files)} file(s)\n" + "\n".join(files)) if files else "No files found"


def _glob(ws: Workspace, args: dict, rng: random.Random) -> str:
    tests_only = args["pattern"].startswith("tests")
    paths = [p for p in ws.files if not tests_only or "/tests/" in p]
    return "\n".join(sorted(paths))


def _todo(ws: Workspace, args: dict, rng: random.Random) -> str:
    todos = args["todos"]
    active = sum(t["status"] == "in_progress" for t in todos)
    return f"Todo list saved: {len(todos)} items ({active} in progress, {len(todos) - active} not started or done)."


def _task(ws: Workspace, args: dict, rng: random.Random) -> str:
    raise AssertionError("Task results come from the subagent conversation")  # see episode.task


RUNNERS: dict[str, Callable[[Workspace, dict, random.Random], str]] = {
    "Read": _read,
    "Edit": _edit,
    "MultiEdit": _multi_edit,
    "Write": _write,
    "Bash": _bash,
    "Grep": _grep,
    "Glob": _glob,
    "TodoWrite": _todo,
    "Task": _task,
}


def grep_hits(ws: Workspace, word: str, definition_only: bool = False) -> list[str]:
    """`path:line:text` for every line mentioning `word` (or defining it)."""
    needle = f"def {word}" if definition_only else word
    hits = []
    for path, text in ws.files.items():
        for number, line in enumerate(text.split("\n"), start=1):
            if needle in line:
                hits.append(f"{path}:{number}:{line}")
    return hits


def changed_paths(ws: Workspace) -> list[str]:
    return [p for p in ws.files if p.endswith("_regression.py")] + ([ws.bug.path] if ws.bug else [])


def test_count(ws: Workspace) -> int:
    return sum(text.count("\ndef test_") for path, text in ws.files.items() if "/tests/" in path)


def pytest_output(ws: Workspace, rng: random.Random, only: str | None) -> str:
    """A pytest report; the planted bug fails its regression test until the fix is in."""
    files = [p for p in ws.files if "/tests/" in p and (only is None or p.endswith(only))]
    bug = ws.planted_bug
    fixed = bug.good in ws.files[bug.path]
    failing = None if fixed else next((p for p in files if p.endswith("_regression.py")), None)
    lines, total = [], 0
    for path in files:
        count = ws.files[path].count("\ndef test_")
        total += count
        if ws.verbose:
            lines += _verbose_lines(ws, path, path == failing)
            continue
        marks = "." * count if path != failing else "." * (count - 1) + "F"
        lines.append(
            f"{path[len(ws.root) + 1 :]} {marks}".ljust(WIDTH - 7)
            + f"[{100 * (files.index(path) + 1) // len(files):3d}%]"
        )
    seconds = f"{rng.uniform(0.04, 1.9):.2f}s"
    head = [
        _rule(" test session starts "),
        "platform linux -- Python 3.11.9, pytest-8.3.2, pluggy-1.5.0",
        f"rootdir: {ws.root}",
        "configfile: pyproject.toml",
        f"collected {total} items",
        "",
    ]
    if failing is None:
        return "\n".join(head + lines + ["", _rule(f" {total} passed in {seconds} ")])
    rel = failing[len(ws.root) + 1 :]
    failure = [
        _rule(" FAILURES "),
        _rule(f" test_{bug.name}_boundary ", "_"),
        "",
        f"    def test_{bug.name}_boundary():",
        f">       assert {bug.name}(BOUNDARY) == EXPECTED",
        "E       AssertionError: assert <result> == <expected>",
        "",
        f"{rel}:9: AssertionError",
        _rule(" short test summary info "),
        f"FAILED {rel}::test_{bug.name}_boundary - AssertionError",
        _rule(f" 1 failed, {total - 1} passed in {seconds} "),
    ]
    return "\n".join(head + lines + [""] + failure)


def _verbose_lines(ws: Workspace, path: str, failing: bool) -> list[str]:
    """`pytest -v` lines of one test module: one per test, its outcome."""
    rel = path[len(ws.root) + 1 :]
    names = [line[4 : line.index("(")] for line in ws.files[path].split("\n") if line.startswith("def test_")]
    outcomes = ["PASSED"] * len(names)
    if failing and outcomes:
        outcomes[-1] = "FAILED"
    return [f"{rel}::{name} {outcome}" for name, outcome in zip(names, outcomes)]


def _rule(title: str, char: str = "=") -> str:
    side = (WIDTH - len(title)) // 2
    return char * side + title + char * (WIDTH - len(title) - side)


def regression_test(rng: random.Random, package: str, module: str, bug: Function) -> str:
    """A pytest module pinning the boundary case (some blank lines keep their indentation)."""
    blank = "    " if rng.random() < 0.5 else ""
    return (
        f'"""Regression test for {bug.name} at the boundary."""\nimport pytest\n\n'
        f"from {package}.{module} import {bug.name}\n\nBOUNDARY = []\nEXPECTED = {bug.name}(BOUNDARY)\n\n\n"
        f"def test_{bug.name}_boundary():\n    result = {bug.name}(BOUNDARY)\n{blank}\n"
        f"    assert result == EXPECTED\n"
    )
