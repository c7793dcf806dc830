"""Views under which a harness's echo of a generated message compares equal to the original.

Harnesses re-render the assistant messages they replay: Claude Code fills in a tool schema's
declared defaults the model left out and right-strips lines of string arguments. These functions
are the coarser views that recognise such an echo (slime PR #2282's rules, with Python's
whitespace; checkpoint-tree and the drift causes strip JavaScript's set too, since that is what
Claude Code strips). The echo-restoring strategies, checkpoint-tree and drift analysis use them.
"""

from __future__ import annotations

import json
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


def rstrip_lines(text: str, characters: frozenset[str] | None = None) -> str:
    """Each `\\n`-separated line of `text` without trailing `characters` (None: Python whitespace)."""
    chars = None if characters is None else "".join(characters)
    return "\n".join(line.rstrip(chars) for line in text.split("\n"))
