"""The long profile's harness text: a manual in the system prompt, project memory, tool usage notes.

Production coding harnesses send several thousand tokens before the task: operating rules, a
project memory file, environment facts, and tool descriptions with detailed usage notes. The
`swe-long` profile (`profiles.py`) reproduces that weight so replay is measured on realistic
contexts. The text is written for this project and is deterministic given the workspace.
"""

from __future__ import annotations

import copy

from trace_tools.simulate.workspace import Workspace

MANUAL = """
# Operating manual

## How to approach a task
- Restate the task to yourself in one sentence before the first tool call, and keep that sentence in mind when deciding what to read next.
- Prefer reading the smallest amount of code that answers the question at hand; widen the search only when the narrow read did not explain the behaviour.
- Reproduce a reported failure with the project's own test runner before changing code, and keep the exact command so you can rerun it after the change.
- When a change touches behaviour that other modules rely on, search for the callers first and read at least one of them.
- Do not guess file contents. If you need to know what a file says, read it, even when you read it earlier in the session and may have edited it since.

## Editing files
- Edit with the smallest replacement that makes the change; include enough surrounding lines in old_string that it matches exactly once.
- Preserve indentation exactly, including blank lines that carry spaces; the edit tool compares bytes, not meaning.
- Never rewrite a whole file to change a few lines. Use Write only for new files or for files you have just generated in full.
- After an edit, rerun the narrowest test that exercises the changed code before moving on to anything else.
- Keep the style of the surrounding code: naming, docstring style, import order, and the project's line length.

## Running commands
- Commands run in a fresh shell in the repository root; environment changes do not persist between calls.
- Quote paths that contain spaces. Prefer absolute paths in arguments to file tools and relative paths on the command line.
- Long-running commands should be given an explicit timeout. A command that is still running when the timeout expires is stopped and its partial output is returned.
- Do not run commands that need network access, interactive input or elevated privileges; they will fail in this sandbox.
- Read the full output of a failing test run before acting on it: the first error is usually the cause and later errors its consequences.

## Tests
- The project uses pytest. Tests live under tests/ and mirror the package layout.
- A regression test pins the exact input that failed, asserts the corrected behaviour, and is named after the function and the case.
- Run the whole suite once at the end, even when the narrow tests pass, and report the totals.

## Version control
- The working tree may contain changes made by the user; never discard them. Use git status and git diff to see what changed.
- Do not commit, push, rebase or create branches unless the user asks for it explicitly.

## Communication
- Keep messages to the user short and factual. Name files and line numbers when referring to code.
- When you are blocked, say what you tried, what you observed, and what you need.
- Your final message summarises the change, the tests you ran and their results, and anything left undone.
"""  # noqa: E501 (prompt text: each line is one rule of the simulated system prompt)

ENVIRONMENT = """
# Environment
- Working directory: {root}
- Platform: linux (x86_64), shell: bash
- Python: 3.11, test runner: pytest 8
- The repository is a git checkout; the default branch is main.
"""

# Usage notes appended to each tool's description in the long profile.
TOOL_NOTES = {
    "Read": [
        "The file_path must be absolute; relative paths are rejected.",
        "By default the whole file is returned; for large files pass offset and limit to read a window.",
        "Lines are numbered like cat -n: the number, a tab, then the line exactly as stored.",
        "Reading a file you edited shows the current contents, including your changes.",
        "Binary files and directories cannot be read with this tool; list directories with Glob instead.",
        "Reading several files in one turn is encouraged when they are all needed for the next decision.",
    ],
    "Edit": [
        "old_string must match the file exactly once unless replace_all is true; otherwise the edit fails and nothing "
        "changes.",
        "Copy old_string from a recent Read of the file, preserving every space and tab; do not include the "
        "line-number prefix.",
        "new_string replaces old_string verbatim, so it must carry the indentation the code needs.",
        "Use replace_all to rename a symbol throughout one file; it is false by default.",
        "The result shows the lines around the change so you can check it without another Read.",
        "Edits to files you have not read in this session are refused; read the file first.",
    ],
    "MultiEdit": [
        "All edits apply to the same file, in the order given; each sees the result of the previous one.",
        "If any edit fails to match, none of them is applied and the file is left unchanged.",
        "Prefer one MultiEdit over several Edit calls when the changes belong together.",
        "Each edit follows the rules of Edit: exact old_string, indentation preserved, replace_all false by default.",
    ],
    "Write": [
        "Write replaces the whole file; everything not in content is lost.",
        "Use it for new files, or for files whose full new contents you have just produced.",
        "The parent directory must exist; create it with Bash first when needed.",
        "Prefer Edit for changes to existing files, which keeps the diff small and reviewable.",
    ],
    "Bash": [
        "Each command runs in a fresh shell in the repository root; cd and exported variables do not persist.",
        "Output longer than 30000 characters is truncated in the middle; redirect to a file and read it when you need "
        "all of it.",
        "Set timeout (milliseconds) for commands that may run long; the default is two minutes and the maximum ten.",
        "Do not use this tool to read, search or edit files; the dedicated tools are faster and their results are "
        "easier to check.",
        "Never run interactive commands, commands that need the network, or commands that change global system state.",
        "Give a short description so the user can follow what you are doing.",
    ],
    "Grep": [
        "The pattern is a ripgrep regular expression; escape literal braces, parentheses and dots.",
        "output_mode content prints matching lines with their paths and line numbers; files_with_matches prints paths "
        "only; count prints counts per file.",
        "Restrict the search with glob (for example '*.py') or path to keep the result short.",
        "Searches respect .gitignore; generated and vendored files are usually skipped.",
    ],
    "Glob": [
        "Patterns use ** for any depth, * for any characters within one path segment, and ? for one character.",
        "Results are sorted by modification time, newest first, which helps find recently edited files.",
        "Use Glob to discover files and Grep to search inside them.",
    ],
    "TodoWrite": [
        "Use the list for tasks with three or more steps; skip it for a single quick change.",
        "Exactly one item is in_progress at a time; mark an item completed as soon as it is done, not in batches.",
        "The list you send replaces the previous one entirely, so always send every item.",
        "Add items when new work is discovered and remove items that became unnecessary.",
    ],
    "Task": [
        "The subagent starts with no memory of this conversation; put everything it needs in prompt.",
        "Subagents are read-only researchers here: they can search and read but not edit or run tests.",
        "Only the subagent's final message comes back, so ask it to report paths, line numbers and conclusions.",
        "Launch a subagent for open-ended searches across many files; for a known file, read it yourself.",
    ],
}


def system_prompt(base: str, ws: Workspace) -> str:
    """The long profile's system prompt: the base rules, the manual, project memory, environment."""
    return "\n".join([base, MANUAL, project_memory(ws), ENVIRONMENT.format(root=ws.root)])


def project_memory(ws: Workspace) -> str:
    """A CLAUDE.md-style memory file: layout and one line per function of the repository."""
    lines = ["# Project memory (CLAUDE.md)", "", f"Package `{ws.package}`; sources under src/, tests under tests/.", ""]
    for path in ws.module_paths():
        lines.append(f"## {path[len(ws.root) + 1 :]}")
        lines += [
            f"- `{f.name}`: handles {f.noun} values; see its docstring for the contract."
            for f in ws.functions
            if f.path == path
        ]
        lines.append("")
    return "\n".join(lines)


def with_notes(tools: list[dict]) -> list[dict]:
    """Tool schemas whose descriptions carry the usage notes, as detailed harnesses send them."""
    out = copy.deepcopy(tools)
    for tool in out:
        function = tool["function"]
        notes = TOOL_NOTES.get(function["name"], [])
        if notes:
            function["description"] += "\n\nUsage notes:\n" + "\n".join(f"- {note}" for note in notes)
    return out
