"""The simulated harness's tool set, as OpenAI function schemas.

The set mirrors what a Claude-Code-like SWE harness offers: file reading and editing (`Read`,
`Edit`, `MultiEdit`, `Write`), a shell (`Bash`), search (`Grep`, `Glob`), a todo list
(`TodoWrite`) and `Task`, which hands a question to a subagent. Two declared defaults matter to
the behaviours: `Edit.replace_all` (false), which the claude-code echo fills in when the model
omitted it (as the measured Claude Code does), and `Bash.timeout`, which no harness fills in.
"""

from __future__ import annotations

import copy
from typing import Any

_STRING = {"type": "string"}


def _function(name: str, description: str, properties: dict[str, Any], required: list[str]) -> dict:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {"type": "object", "properties": properties, "required": required},
        },
    }


def _prop(kind: str, description: str, **extra: Any) -> dict:
    return {"type": kind, "description": description, **extra}


_EDIT_PAIR = {
    "old_string": _prop("string", "Exact text to find; must match the file, indentation included."),
    "new_string": _prop("string", "Text that replaces old_string."),
    "replace_all": _prop("boolean", "Replace every occurrence instead of exactly one.", default=False),
}

SCHEMAS: dict[str, dict] = {
    "Read": _function(
        "Read",
        "Read a text file. Lines come back numbered, starting at 1.",
        {
            "file_path": _prop("string", "Absolute path of the file."),
            "offset": _prop("integer", "First line to return (1-based)."),
            "limit": _prop("integer", "Maximum number of lines to return."),
        },
        ["file_path"],
    ),
    "Edit": _function(
        "Edit",
        "Replace one exact snippet of a file with new text.",
        {
            "file_path": _prop("string", "Absolute path of the file to change."),
            **_EDIT_PAIR,
        },
        ["file_path", "old_string", "new_string"],
    ),
    "MultiEdit": _function(
        "MultiEdit",
        "Apply several Edit-style replacements to one file, in order.",
        {
            "file_path": _prop("string", "Absolute path of the file to change."),
            "edits": {
                "type": "array",
                "description": "Replacements applied one after another.",
                "items": {
                    "type": "object",
                    "properties": copy.deepcopy(_EDIT_PAIR),
                    "required": ["old_string", "new_string"],
                },
            },
        },
        ["file_path", "edits"],
    ),
    "Write": _function(
        "Write",
        "Create or overwrite a file with the given content.",
        {
            "file_path": _prop("string", "Absolute path of the file."),
            "content": _prop("string", "The complete new file content."),
        },
        ["file_path", "content"],
    ),
    "Bash": _function(
        "Bash",
        "Run a shell command in the repository and return its output.",
        {
            "command": _prop("string", "The command line to run."),
            "description": _prop("string", "Five to ten words on what the command does."),
            "timeout": _prop("integer", "Timeout in milliseconds.", default=120000),
        },
        ["command"],
    ),
    "Grep": _function(
        "Grep",
        "Search file contents with a regular expression (ripgrep syntax).",
        {
            "pattern": _prop("string", "Regular expression to search for."),
            "path": _prop("string", "File or directory to search (default: the repository root)."),
            "glob": _prop("string", "Only search files matching this glob, e.g. '*.py'."),
            "output_mode": _prop(
                "string",
                "What to print.",
                enum=["content", "files_with_matches", "count"],
                default="files_with_matches",
            ),
        },
        ["pattern"],
    ),
    "Glob": _function(
        "Glob",
        "List files whose path matches a glob pattern, newest first.",
        {
            "pattern": _prop("string", "Glob pattern such as 'src/**/*.py'."),
            "path": _prop("string", "Directory to search from."),
        },
        ["pattern"],
    ),
    "TodoWrite": _function(
        "TodoWrite",
        "Replace the session's todo list.",
        {
            "todos": {
                "type": "array",
                "description": "The full list, in order.",
                "items": {
                    "type": "object",
                    "properties": {
                        "id": _STRING,
                        "content": _STRING,
                        "status": {"type": "string", "enum": ["pending", "in_progress", "completed"]},
                    },
                    "required": ["id", "content", "status"],
                },
            },
        },
        ["todos"],
    ),
    "Task": _function(
        "Task",
        "Hand a self-contained question to a subagent and get its final answer back.",
        {
            "description": _prop("string", "Three to five words naming the task."),
            "prompt": _prop("string", "Everything the subagent needs to know."),
            "subagent_type": _prop("string", "Which kind of subagent to start.", enum=["general-purpose", "explore"]),
        },
        ["description", "prompt", "subagent_type"],
    ),
}

MAIN_TOOLS = ("Task", "Bash", "Glob", "Grep", "Read", "Edit", "MultiEdit", "Write", "TodoWrite")
SUBAGENT_TOOLS = ("Bash", "Glob", "Grep", "Read")


def tool_schemas(names: tuple[str, ...] | list[str]) -> list[dict]:
    """Fresh copies of the schemas, in the order given (that order is what the harness sends)."""
    return [copy.deepcopy(SCHEMAS[name]) for name in names]


def tool_position(tools: list[dict], name: str) -> int:
    """The tool's position in the request's tool list (what SGLang puts in a call's `index`), -1 if absent."""
    for position, tool in enumerate(tools):
        if tool["function"]["name"] == name:
            return position
    return -1


def declared_defaults(tools: list[dict]) -> dict[str, dict[str, Any]]:
    """`{tool: {argument: default}}` for the top-level arguments whose schema declares a default."""
    out: dict[str, dict[str, Any]] = {}
    for tool in tools:
        function = tool["function"]
        properties = function["parameters"]["properties"]
        found = {key: spec["default"] for key, spec in properties.items() if "default" in spec}
        if found:
            out[function["name"]] = found
    return out
