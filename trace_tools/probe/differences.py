"""How a served value and its echo differ, value by value: blanks stripped at line ends, a
prefix removed, key order and the rule that explains it, reasoning moved to the text, a unified
diff for anything else (used by the harness profile, `probe.profile`)."""

from __future__ import annotations

import difflib
import json
import re
from typing import Any

from trace_tools.render.harness_echo import read_profile as read_profile
from trace_tools.render.normalize import ANY_LINE_END, JS_WHITESPACE

# Characters a harness might strip at a line end: Python's whitespace plus the invisible ones
# JavaScript's trimEnd leaves or removes (zero-width space, BOM, Mongolian vowel separator).
_EXTRA_BLANKS = {"\u200b", "\ufeff", "\u180e"}
_CD_PREFIX = re.compile(r"^cd (\S+) && $")
_CD_START = re.compile(r"^cd (\S+) && ")


def is_blank(char: str) -> bool:
    return char.isspace() or char in _EXTRA_BLANKS


def char_name(char: str) -> str:
    """`U+00A0` style, with the character's escape (readable in JSON and tables)."""
    return f"U+{ord(char):04X} {json.dumps(char)}"


def matching_call(call: dict, echoed: list[dict], position: int) -> dict | None:
    if call.get("id"):
        for candidate in echoed:
            if candidate.get("id") == call["id"]:
                return candidate
    return echoed[position] if position < len(echoed) else None


def raw_arguments(call: dict) -> Any:
    return (call.get("function") or {}).get("arguments")


def moved_reasoning(served: dict, echoed: dict) -> str | None:
    """The separator when the echo's text is the served reasoning, then the served text; else None."""
    reasoning, text = served.get("reasoning_content") or "", served.get("content") or ""
    after = echoed.get("content")
    if (
        not reasoning
        or echoed.get("reasoning_content")
        or not isinstance(after, str)
        or not after.startswith(reasoning)
    ):
        return None
    rest = after[len(reasoning) :]
    if not text:
        return "" if not rest else None
    separator = rest[: len(rest) - len(text)] if rest.endswith(text) else None
    return separator if separator is not None and not separator.strip() else None


def schema_order(tools: list[dict] | None, name: str) -> tuple[str, ...] | None:
    for tool in tools or ():
        function = tool.get("function", tool) if isinstance(tool, dict) else {}
        if isinstance(function, dict) and function.get("name") == name:
            properties = (function.get("parameters") or {}).get("properties") or {}
            return tuple(properties)
    return None


def order_rules(served: tuple, echoed: tuple, added: list[str], schema: tuple | None) -> list[str]:
    """The key-order rules under which `served` becomes `echoed`."""
    rules = []
    kept = tuple(k for k in served if k in echoed)
    if echoed == tuple(added) + kept:
        rules.append("added_keys_first")
    if echoed == kept + tuple(added):
        rules.append("added_keys_last")
    if schema is not None and echoed == tuple(k for k in schema if k in echoed) + tuple(
        k for k in echoed if k not in schema
    ):
        rules.append("schema_order")
    if echoed == tuple(sorted(echoed)):
        rules.append("sorted")
    if not added and echoed == served:
        rules.append("served_order")
    return rules


def removed_prefix(before: str, after: str) -> tuple[str, str]:
    """(prefix, rest) when `before` = prefix + rest and `after` is rest (line ends stripped or not);
    ("", before) when nothing was cut from the front. A `cd DIR && ` prefix is tried first."""
    if not after or rstripped(before, after) is not None:
        return "", before
    match = _CD_START.match(before)
    if match and rstripped(before[match.end() :], after) is not None:
        return before[: match.end()], before[match.end() :]
    head = after.split("\n")[0]
    index = before.find(head, 1) if head else -1
    while index > 0:
        if rstripped(before[index:], after) is not None:
            return before[:index], before[index:]
        index = before.find(head, index + 1)
    return "", before


def rstripped(before: str, after: str) -> set[str] | None:
    """The characters removed when `after` is `before` with blanks stripped from line ends (lines
    ending at `\\n`, or else at `\\r\\n` and a lone `\\r` too); None if not."""
    found = _stripped_lines(before.split("\n"), after.split("\n"))
    if found is None and "\r" in before:
        found = _stripped_lines(*(ANY_LINE_END.split(text) for text in (before, after)))
    return found


def line_convention(before: str, after: str) -> str:
    """The line-end convention (`normalize.LINE_ENDS`) under which `after` is `before` stripped."""
    if "\r" in before and _stripped_lines(before.split("\n"), after.split("\n")) is None:
        return "crlf-cr"
    return "lf"


def _stripped_lines(lines_before: list[str], lines_after: list[str]) -> set[str] | None:
    if len(lines_before) != len(lines_after):
        return None
    removed: set[str] = set()
    for b, a in zip(lines_before, lines_after):
        if not b.startswith(a) or not all(is_blank(c) for c in b[len(a) :]):
            return None
        removed |= set(b[len(a) :])
    return removed


def trailing_run(text: str) -> set[str]:
    """Every blank character in the runs that end the lines of `text`."""
    found: set[str] = set()
    for line in text.split("\n"):
        end = len(line)
        while end and is_blank(line[end - 1]):
            end -= 1
        found |= set(line[end:])
    return found


def trailing_blanks(text: str) -> set[str]:
    """The blank characters a line still ends with after stripping: the ones the harness keeps."""
    return {line[-1] for line in text.split("\n") if line and is_blank(line[-1])}


def character_class(stripped: set[str], kept: set[str]) -> str:
    """Which known whitespace set explains the stripping: JavaScript's trimEnd, Python's rstrip, or neither."""
    if stripped <= JS_WHITESPACE and not kept & JS_WHITESPACE:
        return "javascript-trimEnd"
    if all(c.isspace() for c in stripped) and not any(c.isspace() for c in kept):
        return "python-rstrip"
    return "custom"


def prefix_pattern(prefix: str, cwd: str | None) -> str:
    match = _CD_PREFIX.match(prefix)
    if match and cwd and match.group(1).rstrip("/") == cwd.rstrip("/"):
        return "cd {cwd} && "
    if match:
        return "cd {other directory} && "
    return prefix


def unified_diff(before: str, after: str) -> str:
    lines = difflib.unified_diff(before.splitlines(keepends=True), after.splitlines(keepends=True), "served", "echoed")
    return "".join(line if line.endswith("\n") else line + "\n" for line in lines)
