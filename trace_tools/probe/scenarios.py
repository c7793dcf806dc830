"""The probe's scratch repositories and its library of SWE scenarios (docs/probe.md, "Scenarios").

Each session gets a small Python package with a planted off-by-one bug, written with trailing
whitespace on some lines (so an Edit's `old_string` that carries it still matches the file), and
a scenario: a script the scripted model plays. The scenario is built on the session's first
request from the tool schemas the harness offers, so it only ever calls tools that exist, with
their own argument names:

* **file tools** (Claude Code: `Read`, `Edit`, `Write`, `Bash`; `Grep` when offered): read the
  module (in some sessions with `offset`/`limit`, in some with the test file in parallel),
  search it, run the tests with a `cd <repo> && ` prefix, Edit with multi-line old/new strings
  whose lines carry trailing whitespace (and no optional keys), Write a test file whose lines
  carry trailing whitespace, run the tests without the prefix in parallel with a command that
  `cd`s into a subdirectory, Write a notes file whose type varies across sessions (`.md`,
  `.txt`, `.markdown`, ...), Edit the README with every key given in a non-schema order, and
  answer in text.
* **shell only** (mini-swe-agent's single `bash` tool): the same steps as shell commands (`cat`,
  `grep`, heredocs that write files with trailing whitespace, a Python one-off that edits), two
  commands in one turn, and the harness's own submit command to finish.

The trailing characters rotate across sessions through the space, tab and the wider Unicode /
JavaScript whitespace sets (NBSP, ideographic space, em space, vertical tab, form feed, NEL,
zero-width space, BOM, Ogham space mark), so a probe of 12 sessions shows which characters a
harness strips and which it keeps. Everything is a function of (seed, session index); the seed rotates the characters.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trace_tools.record.script import Script, ScriptCall, ScriptTurn

# Trailing characters the sessions cycle through (space and tab appear in every session).
PROBE_CHARACTERS = ("\u00a0", "\u3000", "\u2003", "\u000b", "\u000c", "\u0085", "\u200b", "\ufeff", "\u1680")
NOTE_TYPES = (".md", ".txt", ".markdown", ".rst", ".yaml", ".mdx")
TASK = (
    "mean() in calc/stats.py returns the wrong value. Fix it, add a regression test under tests/, "
    "run the tests, and leave a short note of the change."
)
SHELL_NAMES = ("bash", "shell", "execute_bash", "run_shell_command", "terminal")


@dataclass(frozen=True)
class Workspace:
    """One session's scratch repository and the trailing whitespace its scenario uses."""

    root: Path
    index: int
    odd: str  # this session's unusual trailing character

    def trail(self, k: int) -> str:
        """The k-th trailing run of this session: always mixes the odd character in."""
        return ("  ", "\t", self.odd, " " + self.odd, "\t " + self.odd)[k % 5]

    @property
    def note_type(self) -> str:
        return NOTE_TYPES[self.index % len(NOTE_TYPES)]


def make_workspace(root: str | Path, index: int, seed: int = 0) -> Workspace:
    """Write session `index`'s scratch repository under `root` and describe it."""
    odd = PROBE_CHARACTERS[(index + seed) % len(PROBE_CHARACTERS)]
    ws = Workspace(Path(root), index, odd)
    files = {
        "calc/__init__.py": '"""Small statistics helpers."""\n',
        "calc/stats.py": stats_module(ws),
        "tests/__init__.py": "",
        "tests/test_stats.py": TEST_MODULE,
        "README.md": f"# calc{ws.trail(0)}\n\nSummary statistics over plain lists.\n",
    }
    for name, text in files.items():
        path = ws.root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    _git_init(ws.root)
    return ws


def _git_init(root: Path) -> None:
    """Make the scratch repository a git repository of its own (a harness inspects git state; it
    must never see, let alone touch, a repository the probe's output directory happens to sit in)."""

    if shutil.which("git") is None:
        return
    identity = ["-c", "user.name=trace-tools probe", "-c", "user.email=probe@localhost", "-c", "commit.gpgsign=false"]
    for command in (["init", "-q"], ["add", "-A"], [*identity, "commit", "-q", "-m", "scratch repository"]):
        subprocess.run(["git", *command], cwd=root, check=True, capture_output=True)


def stats_module(ws: Workspace) -> str:
    return (
        f'"""Summary statistics over plain lists."""{ws.trail(0)}\n'
        "\n\n"
        f"def mean(values):{ws.trail(1)}\n"
        '    """Arithmetic mean of a non-empty list."""\n'
        f"    total = 0{ws.trail(2)}\n"
        "    for value in values:\n"
        "        total += value\n"
        "    return total / (len(values) - 1)\n"
        "\n\n"
        "def spread(values):\n"
        '    """Largest minus smallest value."""\n'
        f"    return max(values) - min(values){ws.trail(3)}\n"
    )


TEST_MODULE = """import unittest

from calc.stats import spread


class SpreadTest(unittest.TestCase):
    def test_spread(self):
        self.assertEqual(spread([3, 1, 2]), 2)
"""


def tool_names(tools: list[dict] | None) -> dict[str, set[str]]:
    """{tool name: its argument names} from OpenAI-format tool schemas."""
    out: dict[str, set[str]] = {}
    for tool in tools or ():
        function = tool.get("function", tool) if isinstance(tool, dict) else {}
        properties = ((function.get("parameters") or {}).get("properties") or {}) if isinstance(function, dict) else {}
        if isinstance(function, dict) and isinstance(function.get("name"), str):
            out[function["name"]] = set(properties)
    return out


def build_scenario(ws: Workspace, tools: list[dict] | None, finish_command: str | None = None) -> Script:
    """The session's script for the tools its harness offers (see the module docstring)."""
    names = tool_names(tools)
    if {"file_path", "old_string", "new_string"} <= names.get("Edit", set()) and "Write" in names and "Bash" in names:
        return Script(f"swe-files-{ws.index:02d}", file_tool_turns(ws, names), _final(ws), TASK)
    shell = next((name for name in SHELL_NAMES if "command" in names.get(name, set())), None)
    if shell is not None:
        turns = shell_turns(ws, shell)
        final = (
            _final(ws)
            if finish_command is None
            else ScriptTurn("The fix is in and tested.", "", (ScriptCall(shell, {"command": finish_command}),))
        )
        return Script(f"swe-shell-{ws.index:02d}", turns, final, TASK)
    return Script("no-usable-tools", [], ScriptTurn(content="I have no tools I can use here."), TASK)


def _final(ws: Workspace) -> ScriptTurn:
    return ScriptTurn(
        "The tests pass; summarise.",
        f"Fixed `mean` in calc/stats.py: it divided by `len(values) - 1`. Added tests/test_mean.py "
        f"and a note in NOTES{ws.note_type}.",
    )


def _call(name: str, **arguments: Any) -> ScriptCall:
    return ScriptCall(name, arguments)


def file_tool_turns(ws: Workspace, names: dict[str, set[str]]) -> list[ScriptTurn]:
    root, module, tests = str(ws.root), f"{ws.root}/calc/stats.py", f"{ws.root}/tests/test_stats.py"
    read = _call("Read", file_path=module, offset=1, limit=40) if ws.index % 3 == 1 else _call("Read", file_path=module)
    reads = (read, _call("Read", file_path=tests)) if ws.index % 2 == 0 else (read,)
    if "Grep" in names:
        search = _call("Grep", pattern="def ", path=root, output_mode="content")
    else:
        search = _call("Bash", command='grep -n "def " calc/stats.py', description="List the functions in stats.py")
    return [
        ScriptTurn("Read the module first.", "", reads),
        ScriptTurn("Find every function.", "Searching the package.", (search,)),
        ScriptTurn(
            "Reproduce.",
            "",
            (_call("Bash", command=f"cd {root} && python3 -m unittest -q", description="Run the tests"),),
        ),
        ScriptTurn("The divisor is off by one.", "Fixing the divisor.", (_edit_mean(ws, module),)),
        ScriptTurn(
            "Add a regression test.",
            "",
            (_call("Write", file_path=f"{root}/tests/test_mean.py", content=regression_test(ws)),),
        ),
        ScriptTurn(
            "Run everything.",
            "",
            (
                _call("Bash", command="python3 -m unittest -q", description="Run the tests again"),
                _call("Bash", command=f"cd {root}/tests && ls", description="List the test files"),
            ),
        ),
        ScriptTurn("Leave a note.", "", (_call("Write", file_path=f"{root}/NOTES{ws.note_type}", content=notes(ws)),)),
        ScriptTurn("Point the README at the note.", "", (_edit_readme(ws),)),
    ]


def _edit_mean(ws: Workspace, module: str) -> ScriptCall:
    old = f'def mean(values):{ws.trail(1)}\n    """Arithmetic mean of a non-empty list."""\n    total = 0{ws.trail(2)}'
    new = (
        f"def mean(values):{ws.trail(1)}\n"
        f'    """Arithmetic mean of a non-empty list."""{ws.trail(4)}\n'
        f"    if not values:{ws.trail(3)}\n"
        '        raise ValueError("mean() of an empty list")\n'
        f"    total = 0{ws.trail(2)}"
    )
    fix_old, fix_new = "    return total / (len(values) - 1)", "    return total / len(values)"
    if ws.index % 2:
        return _call("Edit", file_path=module, old_string=fix_old, new_string=fix_new + ws.trail(0))
    return _call(
        "Edit",
        file_path=module,
        old_string=old + "\n    for value in values:\n        total += value\n" + fix_old,
        new_string=new + "\n    for value in values:\n        total += value\n" + fix_new,
    )


def _edit_readme(ws: Workspace) -> ScriptCall:
    arguments = {
        "file_path": f"{ws.root}/README.md",
        "new_string": f"Summary statistics over plain lists.{ws.trail(1)}\nSee NOTES{ws.note_type}.{ws.trail(2)}",
        "old_string": "Summary statistics over plain lists.",
        "replace_all": False,
    }
    return ScriptCall("Edit", arguments)


def regression_test(ws: Workspace) -> str:
    return (
        f"import unittest{ws.trail(0)}\n"
        "\n"
        "from calc.stats import mean\n"
        "\n\n"
        f"class MeanTest(unittest.TestCase):{ws.trail(1)}\n"
        "    def test_mean(self):\n"
        f"        self.assertEqual(mean([1, 2, 3]), 2){ws.trail(2)}\n"
        f"{ws.trail(3)}\n"
        "    def test_single(self):\n"
        "        self.assertEqual(mean([4]), 4)\n"
    )


def notes(ws: Workspace) -> str:
    return (
        f"# Notes{ws.trail(0)}\n"
        "\n"
        f"- mean() divided by len - 1;{ws.trail(1)}\n"
        f"  it now divides by len.{ws.trail(2)}\n"
        f"- tests/test_mean.py covers it.{ws.trail(3)}\n"
    )


def shell_turns(ws: Workspace, shell: str) -> list[ScriptTurn]:
    root = str(ws.root)
    fix = (
        "python3 - <<'EOF'\n"
        "import pathlib\n"
        f"path = pathlib.Path('calc/stats.py'){ws.trail(1)}\n"
        "text = path.read_text()\n"
        f"path.write_text(text.replace('(len(values) - 1)', 'len(values)')){ws.trail(2)}\n"
        "EOF"
    )
    write_test = f"cat > tests/test_mean.py <<'EOF'\n{regression_test(ws)}EOF"
    write_notes = f"cat > NOTES.md <<'EOF'\n{notes(ws)}EOF"

    def bash(command: str) -> ScriptCall:
        return _call(shell, command=command)

    return [
        ScriptTurn("Read the module first.", "Reading the module.", (bash("cat calc/stats.py"),)),
        ScriptTurn("Find every function.", "", (bash('grep -n "def " calc/stats.py'),)),
        ScriptTurn("Reproduce.", "", (bash(f"cd {root} && python3 -m unittest -q"),)),
        ScriptTurn("The divisor is off by one.", "Fixing the divisor.", (bash(fix),)),
        ScriptTurn("Add a regression test.", "", (bash(write_test),)),
        ScriptTurn("Run everything.", "", (bash("python3 -m unittest -q"), bash(f"cd {root}/tests && ls"))),
        ScriptTurn("Leave a note.", "", (bash(write_notes),)),
    ]
