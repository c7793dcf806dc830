"""Views under which a harness's echo of a generated message compares equal to the original.

Harnesses re-render the assistant messages they replay: Claude Code fills in a tool schema's
declared defaults the model left out and right-strips lines of string arguments. These functions
are the coarser views that recognise such an echo (slime PR #2282's rules, with Python's
whitespace; checkpoint-tree and the drift causes strip JavaScript's set too, since that is what
Claude Code strips). The echo-restoring strategies, checkpoint-tree and drift analysis use them.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Sequence

# ECMAScript WhiteSpace and LineTerminator code points: what String.prototype.trimEnd removes.
JS_WHITESPACE = frozenset("\t\n\v\f\r \u00a0\u1680\u2028\u2029\u202f\u205f\u3000\ufeff") | {
    chr(c) for c in range(0x2000, 0x200B)
}
# Python's whitespace (`str.isspace`): what `str.rstrip()` removes.
PYTHON_WHITESPACE = frozenset("\t\n\v\f\r\x1c\x1d\x1e\x1f \x85\xa0\u1680\u2028\u2029\u202f\u205f\u3000") | {
    chr(c) for c in range(0x2000, 0x200B)
}
# Every character a known harness strips at a line end: Python's whitespace and JavaScript's.
ANY_LINE_END_BLANK = JS_WHITESPACE | PYTHON_WHITESPACE


def parse_arguments(arguments: Any) -> Any:
    """Tool-call arguments as an object: JSON text parsed, anything unparsable returned as is."""
    if isinstance(arguments, str):
        try:
            return json.loads(arguments)
        except ValueError:
            return arguments
    return arguments


def tool_defaults(tools_schema: Sequence[dict] | None) -> dict[str, dict[str, Any]]:
    """`{tool name: {argument: declared default}}` from OpenAI-format tool schemas (read-only).

    Only properties whose schema carries a `"default"` key are collected, and tools that declare
    none are left out, so an empty result means "nothing to drop". Memoised per schema list
    object: a session's tools are parsed once and asked for on every echo check.
    """
    if tools_schema is None:
        return {}
    known = _DEFAULTS.get(id(tools_schema))
    if known is None or known[0] is not tools_schema:
        if len(_DEFAULTS) > 1024:
            _DEFAULTS.clear()
        known = _DEFAULTS[id(tools_schema)] = (tools_schema, _collect_defaults(tools_schema))
    return known[1]


_DEFAULTS: dict[int, tuple[Any, dict[str, dict[str, Any]]]] = {}


def _collect_defaults(tools_schema: Sequence[dict]) -> dict[str, dict[str, Any]]:
    defaults: dict[str, dict[str, Any]] = {}
    for entry in tools_schema:
        function = entry.get("function") if isinstance(entry, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            continue
        properties = (function.get("parameters") or {}).get("properties") or {}
        declared = {
            prop: spec["default"] for prop, spec in properties.items() if isinstance(spec, dict) and "default" in spec
        }
        if declared:
            defaults[function["name"]] = declared
    return defaults


def _equals_default(value: Any, default: Any) -> bool:
    # `1 == True` in Python; a harness that fills `1` where the schema says `true` made a
    # different call, so booleans only match themselves.
    if isinstance(value, bool) or isinstance(default, bool):
        return value is default
    return value == default


def drop_schema_defaults(args: Any, defaults: dict[str, Any] | None) -> Any:
    """`args` without the top-level keys whose value equals the schema's declared default.

    Omitting an argument and passing its default are the same call. Non-dict arguments and an
    empty `defaults` pass through unchanged (the same object); nested objects are not inspected.
    """
    if not isinstance(args, dict) or not defaults:
        return args
    return {
        key: value for key, value in args.items() if not (key in defaults and _equals_default(value, defaults[key]))
    }


def strip_trailing_ws(x: Any, characters: frozenset[str] | None = None) -> Any:
    """Right-strip every line of every string inside `x` (dict values and list items, recursively).

    `characters` is the set stripped (None: Python's whitespace, what `str.rstrip()` removes, as
    slime's restore does). Dict keys are left alone; anything that is not a str, dict or list
    passes through.
    """
    if isinstance(x, str):
        return rstrip_lines(x, characters)
    if isinstance(x, dict):
        return {key: strip_trailing_ws(value, characters) for key, value in x.items()}
    if isinstance(x, list):
        return [strip_trailing_ws(item, characters) for item in x]
    return x


# Line-end conventions a harness strips under (a profile's `line_ends`): "lf" splits at `\\n` only
# (a `\\r` before it is just another character of the line); "crlf-cr" also ends a line at `\\r\\n`
# and a lone `\\r`, and keeps those separators (Claude Code: `a  \\r\\n` becomes `a\\r\\n`).
LINE_ENDS = ("lf", "crlf-cr")
ANY_LINE_END = re.compile(r"(\r\n|\r|\n)")  # a split keeps the separators


def rstrip_lines(text: str, characters: frozenset[str] | None = None, line_ends: str = "lf") -> str:
    """Each line of `text` without trailing `characters` (None: Python whitespace), lines ending
    as the `line_ends` convention says (`LINE_ENDS`)."""
    chars = None if characters is None else "".join(characters)
    if line_ends == "lf" or "\r" not in text:
        return "\n".join(line.rstrip(chars) for line in text.split("\n"))
    parts = ANY_LINE_END.split(text)  # line, separator, line, ..., line
    parts[::2] = [line.rstrip(chars) for line in parts[::2]]
    return "".join(parts)


# -- the echo-equivalence classes both checkpoint-tree and the drift causes apply ----------------
def blank_lines_view(text: str) -> str:
    """`text` as every known harness's line stripping leaves it: any blank (`ANY_LINE_END_BLANK`)
    stripped before `\\n`, `\\r\\n` and a lone `\\r`, and a `\\r\\n` counted as `\\n` (a harness
    that strips under "lf" removes the `\\r`, one under "crlf-cr" keeps it)."""
    stripped = rstrip_lines(text, ANY_LINE_END_BLANK, "crlf-cr")
    return stripped.replace("\r\n", "\n") if "\r" in stripped else stripped


def blank_lines_everywhere(x: Any) -> Any:
    """`blank_lines_view` of every string inside `x` (dict values and list items, recursively)."""
    if isinstance(x, str):
        return blank_lines_view(x)
    if isinstance(x, dict):
        return {key: blank_lines_everywhere(value) for key, value in x.items()}
    if isinstance(x, list):
        return [blank_lines_everywhere(item) for item in x]
    return x


def tool_types(tools_schema: Sequence[dict] | None) -> dict[str, dict[str, str]]:
    """`{tool name: {argument: JSON-schema type}}` for the scalar types a string can be coerced
    to (integer, number, boolean); memoised per schema list object like `tool_defaults`."""
    if not tools_schema:
        return {}
    known = _TYPES.get(id(tools_schema))
    if known is None or known[0] is not tools_schema:
        if len(_TYPES) > 1024:
            _TYPES.clear()
        known = _TYPES[id(tools_schema)] = (tools_schema, _collect_types(tools_schema))
    return known[1]


_TYPES: dict[int, tuple[Any, dict[str, dict[str, str]]]] = {}
_COERCIBLE = ("integer", "number", "boolean")
_INTEGER = re.compile(r"-?(0|[1-9][0-9]*)")


def _collect_types(tools_schema: Sequence[dict]) -> dict[str, dict[str, str]]:
    types: dict[str, dict[str, str]] = {}
    for entry in tools_schema:
        function = entry.get("function", entry) if isinstance(entry, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            continue
        properties = (function.get("parameters") or function.get("input_schema") or {}).get("properties") or {}
        declared = {
            prop: spec["type"]
            for prop, spec in properties.items()
            if isinstance(spec, dict) and spec.get("type") in _COERCIBLE
        }
        if declared:
            types[function["name"]] = declared
    return types


def coerce_to_schema(args: Any, types: dict[str, str] | None) -> Any:
    """`args` with top-level string values turned into the schema's scalar type where the string
    spells one exactly (`"60000"` → 60000 for an integer, `"false"` → False for a boolean), as
    clients that validate arguments against the tool schema echo them. Anything else unchanged."""
    if not isinstance(args, dict) or not types:
        return args
    out = None
    for key, kind in types.items():
        value = args.get(key)
        if isinstance(value, str):
            typed = _coerced(value, kind)
            if typed is not value:
                out = out if out is not None else dict(args)
                out[key] = typed
    return args if out is None else out


def _coerced(value: str, kind: str) -> Any:
    if kind == "boolean":
        return {"true": True, "false": False}.get(value, value)
    if _INTEGER.fullmatch(value):
        return int(value)
    if kind == "number":
        try:
            number = float(value)
        except ValueError:
            return value
        return number if number == number and abs(number) != float("inf") else value
    return value


# `cd <dir> && ` forms that name the working directory: bare, trailing slash, quoted.
def cwd_prefixes(cwd: str | None) -> tuple[str, ...]:
    """The `cd <cwd> && ` spellings that change nothing in a shell already in `cwd`."""
    if not cwd:
        return ()
    bare = cwd.rstrip("/") or "/"
    spellings = {bare, bare + "/", f'"{bare}"', f"'{bare}'", f'"{bare}/"', f"'{bare}/'"}
    return tuple(sorted((f"cd {d} && " for d in spellings), key=len, reverse=True))


def strip_cwd_prefix(args: Any, prefixes: tuple[str, ...]) -> Any:
    """`args` with a leading `cd <cwd> && ` (one of `prefixes`) removed from top-level strings."""
    if not isinstance(args, dict) or not prefixes:
        return args
    out = None
    for key, value in args.items():
        if isinstance(value, str) and value.startswith("cd "):
            for prefix in prefixes:
                if value.startswith(prefix):
                    out = out if out is not None else dict(args)
                    out[key] = value[len(prefix) :]
                    break
    return args if out is None else out


def arguments_view(
    args: Any,
    defaults: dict[str, Any] | None = None,
    types: dict[str, str] | None = None,
    prefixes: tuple[str, ...] = (),
) -> Any:
    """One call's arguments under every echo-equivalence class at once: JSON parsed (spacing, key
    order), strings coerced to the schema's type, schema defaults dropped, a `cd <cwd> && ` prefix
    removed, blanks stripped at line ends under any harness's set and line-end convention."""
    parsed = coerce_to_schema(parse_arguments(args), types)
    return blank_lines_everywhere(strip_cwd_prefix(drop_schema_defaults(parsed, defaults), prefixes))


@dataclass(frozen=True)
class EchoSchema:
    """What the echo-equivalence classes need to know about a session: its tools' declared
    defaults and scalar types, and the `cd <cwd> && ` spellings of its working directory."""

    defaults: dict[str, dict[str, Any]] = field(default_factory=dict)
    types: dict[str, dict[str, str]] = field(default_factory=dict)
    prefixes: tuple[str, ...] = ()

    @classmethod
    def of(cls, tools: Sequence[dict] | None, cwd: str | None = None) -> "EchoSchema":
        return cls(tool_defaults(tools), tool_types(tools), cwd_prefixes(cwd))

    def arguments(self, name: Any, args: Any) -> Any:
        """`arguments_view` of one call of tool `name`."""
        if not isinstance(name, str):
            return arguments_view(args, None, None, self.prefixes)
        return arguments_view(args, self.defaults.get(name), self.types.get(name), self.prefixes)
