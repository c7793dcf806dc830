"""Views under which a harness's echo of a generated message compares equal to the original.

Harnesses re-render the assistant messages they replay: Claude Code fills in a tool schema's
declared defaults the model left out and right-strips every line of string arguments. These
functions are the coarser views that recognise such an echo (slime PR #2282's rules). Both the
echo-restoring strategies and drift analysis use them.
"""

from __future__ import annotations

import json
from typing import Any, Sequence


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


def strip_trailing_ws(x: Any) -> Any:
    """Right-strip every line of every string inside `x` (dict values and list items, recursively).

    Dict keys are left alone; anything that is not a str, dict or list passes through.
    """
    if isinstance(x, str):
        return "\n".join(line.rstrip() for line in x.split("\n"))
    if isinstance(x, dict):
        return {key: strip_trailing_ws(value) for key, value in x.items()}
    if isinstance(x, list):
        return [strip_trailing_ws(item) for item in x]
    return x
