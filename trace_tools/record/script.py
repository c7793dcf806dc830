"""The scripted model's script: what the model emits, turn by turn (docs/probe.md, "Script format").

A script file is JSON:

    {"format": "trace-tools-script", "version": 1,
     "name": "fix-mean",
     "task": "Fix the bug in calc/stats.py",        # optional: the prompt `probe` gives the harness
     "turns": [
       {"reasoning": "Look first.", "content": "", "calls": [
          {"name": "Read", "arguments": {"file_path": "/repo/calc/stats.py"}}]},
       {"content": "Fixed."}
     ],
     "final": {"content": "Done."}}                  # optional: every turn past the end

Each turn: `reasoning` (text or absent: the family's writer puts it in its reasoning block),
`content` (visible text), `calls` (tool calls in order; arguments keep their key order, which is
the order the model writes them). A turn without calls ends the agent's loop in most harnesses.
Several scripts in one file: `{"format": ..., "version": 1, "sessions": {"KEY": SCRIPT, "*": SCRIPT}}`,
where KEY is a recorder session key and `*` serves every other session.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trace_tools.errors import UnusableInput, UsageError

FORMAT, VERSION = "trace-tools-script", 1


@dataclass(frozen=True)
class ScriptCall:
    name: str
    arguments: dict[str, Any]


@dataclass(frozen=True)
class ScriptTurn:
    reasoning: str = ""
    content: str = ""
    calls: tuple[ScriptCall, ...] = ()

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.reasoning:
            out["reasoning"] = self.reasoning
        out["content"] = self.content
        if self.calls:
            out["calls"] = [{"name": c.name, "arguments": c.arguments} for c in self.calls]
        return out


@dataclass
class Script:
    name: str
    turns: list[ScriptTurn]
    final: ScriptTurn = field(default_factory=lambda: ScriptTurn(content="Done."))
    task: str = ""

    def turn(self, position: int) -> ScriptTurn:
        """The turn at `position` (assistant messages so far); the final answer past the end."""
        return self.turns[position] if position < len(self.turns) else self.final

    def to_json(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "version": VERSION,
            "name": self.name,
            "task": self.task,
            "turns": [turn.to_json() for turn in self.turns],
            "final": self.final.to_json(),
        }


class ScriptBook:
    """Scripts by session key, `*` for every other session."""

    def __init__(self, scripts: dict[str, Script]):
        self.scripts = scripts

    def __call__(self, session: str, tools: list[dict] | None = None) -> Script:
        script = self.scripts.get(session) or self.scripts.get("*")
        if script is None:
            raise UsageError(f"the script has no entry for session {session!r} and no '*' entry")
        return script


def load_scripts(path: str | Path) -> ScriptBook:
    """Read a script file (one script, or `sessions`); a malformed one is a usage error naming the field."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UnusableInput(f"no such script file: {path}") from None
    except ValueError as exc:
        raise UsageError(f"script {path} is not JSON: {exc}") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT or data.get("version") != VERSION:
        raise UsageError(f'script {path} must be a JSON object with "format": "{FORMAT}", "version": {VERSION}')
    if "sessions" in data:
        sessions = data["sessions"]
        if not isinstance(sessions, dict) or not sessions:
            raise UsageError(f"script {path}: 'sessions' must map session keys to scripts")
        return ScriptBook({key: parse_script(value, f"{path}: sessions.{key}") for key, value in sessions.items()})
    return ScriptBook({"*": parse_script(data, str(path))})


def parse_script(data: Any, where: str) -> Script:
    if not isinstance(data, dict) or not isinstance(data.get("turns"), list):
        raise UsageError(f"{where}: a script needs a 'turns' list")
    turns = [_turn(turn, f"{where}: turns[{i}]") for i, turn in enumerate(data["turns"])]
    final = _turn(data["final"], f"{where}: final") if "final" in data else ScriptTurn(content="Done.")
    return Script(str(data.get("name") or "script"), turns, final, str(data.get("task") or ""))


def _turn(data: Any, where: str) -> ScriptTurn:
    if not isinstance(data, dict):
        raise UsageError(f"{where} must be an object")
    unknown = set(data) - {"reasoning", "content", "calls"}
    if unknown:
        raise UsageError(f"{where} has unknown keys {sorted(unknown)} (reasoning, content, calls)")
    for key in ("reasoning", "content"):
        if not isinstance(data.get(key, ""), str):
            raise UsageError(f"{where}.{key} must be text")
    calls = data.get("calls") or []
    if not isinstance(calls, list):
        raise UsageError(f"{where}.calls must be a list")
    return ScriptTurn(
        data.get("reasoning", ""), data.get("content", ""), tuple(_call(c, f"{where}.calls") for c in calls)
    )


def _call(data: Any, where: str) -> ScriptCall:
    if (
        not isinstance(data, dict)
        or not isinstance(data.get("name"), str)
        or not isinstance(data.get("arguments", {}), dict)
    ):
        raise UsageError(f"{where}: each call needs a 'name' and an 'arguments' object")
    return ScriptCall(data["name"], dict(data.get("arguments", {})))
