"""The probe's scratch repositories and its library of SWE scenarios (docs/probe.md, "Scenarios").

Each session gets a small Python package with a planted off-by-one bug, written with trailing
whitespace on some lines (so an Edit's `old_string` that carries it still matches the file), and
a scenario: a script the scripted model plays. The scenario is built on the session's first
request from the tool schemas the harness offers, so it only ever calls tools that exist, with
their own argument names:

* **file tools** (Claude Code: `Read`, `Edit`, `Write`, `Bash`; `Grep` when offered; the same
  roles under another harness's own tool and argument names, `FileTools`): read the
  module (in some sessions with `offset`/`limit`, in some with the test file in parallel),
  search it, run the tests with a `cd <repo> && ` prefix, Edit with multi-line old/new strings
  whose lines carry trailing whitespace (and no optional keys), Write a test file whose lines
  carry trailing whitespace, run the tests without the prefix in parallel with a command that
  `cd`s into a subdirectory, Write a notes file whose type varies across sessions (`.md`,
  `.txt`, `.markdown`, ...), Edit the README with every key given in a non-schema order, and
  answer in text. From session `EXTENDED_FROM` on, the extended classes follow (`extended_turns`).
* **shell only** (mini-swe-agent's single `bash` tool, Codex CLI's `exec_command(cmd)`): the same
  steps as shell commands (`cat`, `grep`, heredocs that write files with trailing whitespace, a
  Python one-off that edits), two commands in one turn, and the harness's own submit command to finish.

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
SHELL_NAMES = ("bash", "shell", "execute_bash", "run_shell_command", "terminal", "exec_command")
# What a shell tool calls its command line: `command`, or `cmd` (Codex CLI's `exec_command`).
COMMAND_ARGUMENTS = ("command", "cmd")
# Sessions from this index on add the extended scenario classes (`extended_turns`); sessions 0-2
# play the base scenario the shipped profiles were measured on, so a short probe stays comparable.
EXTENDED_FROM = 3


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


@dataclass(frozen=True)
class FileTools:
    """A harness's file tools and their argument names (Claude Code `Edit(file_path, old_string, ...)`,
    Qwen Code `edit(file_path, ...)`, opencode `edit(filePath, oldString, ...)`, ...)."""

    read: str
    edit: str
    write: str
    shell: str
    search: str | None
    tool_search: str | None
    path: str
    old: str
    new: str
    replace_all: str | None
    shell_arguments: frozenset[str]

    def call(self, tool: str, **arguments: Any) -> ScriptCall:
        """A call with the scenario's generic argument names spelled as this harness spells them."""
        spelled = {"file": self.path, "old": self.old, "new": self.new, "replace_all": self.replace_all}
        return ScriptCall(tool, {(spelled.get(key) or key): value for key, value in arguments.items()})

    def shell_call(self, command: str, description: str, **extra: Any) -> ScriptCall:
        arguments: dict[str, Any] = {"command": command}
        if "description" in self.shell_arguments:
            arguments["description"] = description
        arguments.update((key, value) for key, value in extra.items() if key in self.shell_arguments)
        return ScriptCall(self.shell, arguments)


def _first(candidates: tuple[str, ...], present: set[str] | dict) -> str | None:
    return next((name for name in candidates if name in present), None)


def file_tools(names: dict[str, set[str]]) -> FileTools | None:
    """The harness's file tools, when it offers a reader, an editor, a writer and a shell."""
    read, write = _first(("Read", "read_file", "read"), names), _first(("Write", "write_file", "write"), names)
    edit, shell = _first(("Edit", "edit", "replace"), names), _first(("Bash", "run_shell_command", "bash"), names)
    if not (read and write and edit and shell):
        return None
    edit_arguments = names[edit]
    path, old = _first(("file_path", "filePath"), edit_arguments), _first(("old_string", "oldString"), edit_arguments)
    new = _first(("new_string", "newString"), edit_arguments)
    if not (path and old and new) or path not in names[write] or "command" not in names[shell]:
        return None
    return FileTools(
        read,
        edit,
        write,
        shell,
        _first(("Grep", "grep_search", "grep"), names),
        _first(("ToolSearch", "tool_search"), names),
        path,
        old,
        new,
        _first(("replace_all", "replaceAll"), edit_arguments),
        frozenset(names[shell]),
    )


def build_scenario(ws: Workspace, tools: list[dict] | None, finish_command: str | None = None) -> Script:
    """The session's script for the tools its harness offers (see the module docstring)."""
    names = tool_names(tools)
    kit = file_tools(names)
    if kit is not None:
        return Script(f"swe-files-{ws.index:02d}", file_tool_turns(ws, kit), _final(ws), TASK)
    shell = next((name for name in SHELL_NAMES if _first(COMMAND_ARGUMENTS, names.get(name, set()))), None)
    if shell is not None:
        argument = _first(COMMAND_ARGUMENTS, names[shell]) or "command"
        turns = shell_turns(ws, shell, argument)
        final = (
            _final(ws)
            if finish_command is None
            else ScriptTurn("The fix is in and tested.", "", (ScriptCall(shell, {argument: finish_command}),))
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


def file_tool_turns(ws: Workspace, kit: FileTools) -> list[ScriptTurn]:
    root, module, tests = str(ws.root), f"{ws.root}/calc/stats.py", f"{ws.root}/tests/test_stats.py"
    read = kit.call(kit.read, file=module, offset=1, limit=40) if ws.index % 3 == 1 else kit.call(kit.read, file=module)
    reads = (read, kit.call(kit.read, file=tests)) if ws.index % 2 == 0 else (read,)
    if kit.search is not None:
        mode = {"output_mode": "content"} if kit.search == "Grep" else {}  # Claude Code's Grep lists files by default
        search = kit.call(kit.search, pattern="def ", path=root, **mode)
    else:
        search = kit.shell_call('grep -n "def " calc/stats.py', "List the functions in stats.py")
    turns = [
        ScriptTurn("Read the module first.", "", reads),
        ScriptTurn("Find every function.", "Searching the package.", (search,)),
        ScriptTurn("Reproduce.", "", (kit.shell_call(f"cd {root} && python3 -m unittest -q", "Run the tests"),)),
        ScriptTurn("The divisor is off by one.", "Fixing the divisor.", (_edit_mean(ws, kit, module),)),
        ScriptTurn(
            "Add a regression test.",
            "",
            (kit.call(kit.write, file=f"{root}/tests/test_mean.py", content=regression_test(ws)),),
        ),
        ScriptTurn(
            "Run everything.",
            "",
            (
                kit.shell_call("python3 -m unittest -q", "Run the tests again"),
                kit.shell_call(f"cd {root}/tests && ls", "List the test files"),
            ),
        ),
        ScriptTurn("Leave a note.", "", (kit.call(kit.write, file=f"{root}/NOTES{ws.note_type}", content=notes(ws)),)),
        ScriptTurn("Point the README at the note.", "", (_edit_readme(ws, kit),)),
    ]
    return turns + (extended_turns(ws, kit) if ws.index >= EXTENDED_FROM else [])


def extended_turns(ws: Workspace, kit: FileTools) -> list[ScriptTurn]:
    """The scenario classes beyond the base scenario (docs/probe.md, "Scenarios"): a file of another
    type (`.js`, `.yaml`, `.mdx`, `.MD`, a Makefile's tab-led recipes), CRLF and lone-CR line ends,
    string-typed numbers and booleans, three calls in one turn, and a tool-list change where the
    harness can load tools on demand."""
    root = str(ws.root)
    name, text = extra_file(ws)
    turns = [
        ScriptTurn("Add the project file.", "", (kit.call(kit.write, file=f"{root}/{name}", content=text),)),
        ScriptTurn(
            "Record the line-end samples.",
            "",
            (kit.call(kit.write, file=f"{root}/samples/lines{ws.note_type}", content=line_end_text(ws)),),
        ),
        ScriptTurn("Run the tests with a time limit.", "", (_typed_shell(kit),)),
        ScriptTurn(
            "Check the three files at once.",
            "",
            (
                kit.call(kit.read, file=f"{root}/{name}"),
                kit.call(kit.read, file=f"{root}/samples/lines{ws.note_type}"),
                kit.shell_call("git status --short", "Show the changed files"),
            ),
        ),
    ]
    if kit.replace_all is not None:
        typed = kit.call(
            kit.edit, file=f"{root}/{name}", old=EXTRA_MARKER, new=EXTRA_MARKER + " (checked)", replace_all="false"
        )
        turns.append(ScriptTurn("Mark the file checked.", "", (typed,)))
    if kit.tool_search is not None:
        query = "select:CronCreate" if kit.tool_search == "ToolSearch" else "cron"
        turns.append(ScriptTurn("Look for a scheduler tool.", "", (kit.call(kit.tool_search, query=query),)))
    return turns


def _typed_shell(kit: FileTools) -> ScriptCall:
    """A shell call whose number argument is written as a string (`"60000"`), as models often do."""
    return kit.shell_call("python3 -m unittest -q", "Run the tests with a limit", timeout="60000")


def _edit_mean(ws: Workspace, kit: FileTools, module: str) -> ScriptCall:
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
        return kit.call(kit.edit, file=module, old=fix_old, new=fix_new + ws.trail(0))
    return kit.call(
        kit.edit,
        file=module,
        old=old + "\n    for value in values:\n        total += value\n" + fix_old,
        new=new + "\n    for value in values:\n        total += value\n" + fix_new,
    )


def _edit_readme(ws: Workspace, kit: FileTools) -> ScriptCall:
    """Every key given, in a non-schema order (new before old)."""
    arguments: dict[str, Any] = {
        "file": f"{ws.root}/README.md",
        "new": f"Summary statistics over plain lists.{ws.trail(1)}\nSee NOTES{ws.note_type}.{ws.trail(2)}",
        "old": "Summary statistics over plain lists.",
    }
    if kit.replace_all is not None:
        arguments["replace_all"] = False
    return kit.call(kit.edit, **arguments)


EXTRA_MARKER = "trace-tools probe"


def extra_file(ws: Workspace) -> tuple[str, str]:
    """Session `index`'s file of another type: its name and text (trailing whitespace on some lines)."""
    t = ws.trail
    files = (
        ("app.js", f"// {EXTRA_MARKER}{t(0)}\nexport function mean(values) {{{t(1)}\n  return 0;\n}}{t(2)}\n"),
        ("config.yaml", f"# {EXTRA_MARKER}{t(0)}\nname: calc{t(1)}\ntests:\n  - tests/{t(2)}\n"),
        ("page.mdx", f"# {EXTRA_MARKER}{t(0)}\n\nimport Chart from './chart'{t(1)}\n\n<Chart />{t(2)}\n"),
        ("GUIDE.MD", f"# {EXTRA_MARKER}{t(0)}\n\nRun the tests.{t(1)}\n"),
        ("Makefile", f"# {EXTRA_MARKER}{t(0)}\ntest:{t(1)}\n\tpython3 -m unittest -q{t(2)}\n\t@echo done\n"),
    )
    return files[ws.index % len(files)]


def line_end_text(ws: Workspace) -> str:
    """CRLF lines (some with spaces before the CR), a lone-CR line end and an LF one."""
    return f"first line{ws.trail(0)}\r\nsecond line\r\nthird line{ws.trail(1)}\rfourth line{ws.trail(2)}\nlast\r\n"


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


def shell_turns(ws: Workspace, shell: str, argument: str = "command") -> list[ScriptTurn]:
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
        return _call(shell, **{argument: command})

    return [
        ScriptTurn("Read the module first.", "Reading the module.", (bash("cat calc/stats.py"),)),
        ScriptTurn("Find every function.", "", (bash('grep -n "def " calc/stats.py'),)),
        ScriptTurn("Reproduce.", "", (bash(f"cd {root} && python3 -m unittest -q"),)),
        ScriptTurn("The divisor is off by one.", "Fixing the divisor.", (bash(fix),)),
        ScriptTurn("Add a regression test.", "", (bash(write_test),)),
        ScriptTurn("Run everything.", "", (bash("python3 -m unittest -q"), bash(f"cd {root}/tests && ls"))),
        ScriptTurn("Leave a note.", "", (bash(write_notes),)),
    ]
