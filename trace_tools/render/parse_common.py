"""What every tool-call parser shares: the reasoning tags, collecting call blocks, the OpenAI form
of a call, and typing a parameter value from the request's tool schemas
(docs/rendering.md#chat-templates-and-the-response-parser)."""

from __future__ import annotations

import ast
import json
import re
from typing import Any, Callable, Sequence

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
_STRING_TYPES = {"string", "str", "text", "varchar", "char", "enum"}
_INT_PREFIXES = ("int", "uint", "long", "short", "unsigned")


def collect_calls(
    text: str, block: re.Pattern, parse: Callable[[str], dict | str], start: int = 0, end: int | None = None
) -> tuple[list[dict], list[str], str]:
    """Parse every `block` match (its group 1) in `text[start:end]`.

    Returns (calls, errors, stray): stray is the text between and around the calls, with the raw
    text of each block that did not parse kept in place.
    """
    end = len(text) if end is None else end
    calls, errors, stray, position = [], [], [], start
    for match in block.finditer(text, start, end):
        stray.append(text[position : match.start()])
        call = parse(match.group(1))
        if isinstance(call, str):
            errors.append(call)
            stray.append(match.group(0))
        else:
            calls.append(call)
        position = match.end()
    stray.append(text[position:end])
    return calls, errors, "".join(stray)


def tool_call(name: str, arguments: dict) -> dict:
    """A parsed call in OpenAI form, arguments as a dict."""
    return {"type": "function", "function": {"name": name, "arguments": arguments}}


def schema_properties(tools: Sequence[dict] | None, name: str) -> dict:
    """The JSON-schema `properties` of tool `name` (OpenAI `{"type":"function","function":...}` or flat)."""
    for tool in tools or ():
        if not isinstance(tool, dict):
            continue
        function = tool.get("function")
        if not isinstance(function, dict):
            function = tool
        if function.get("name") != name:
            continue
        parameters = function.get("parameters") or {}
        properties = parameters.get("properties") if isinstance(parameters, dict) else None
        return properties if isinstance(properties, dict) else {}
    return {}


def convert_parameter(value: str, schema: Any) -> Any:
    """Type an XML parameter value from its schema, as the upstream Qwen3-Coder parser does.

    One deliberate difference: a string-typed (or undeclared) value is always kept verbatim, where
    upstream turns the text `null` into None for every type.
    """
    kind = _schema_type(schema)
    if kind is None or kind in _STRING_TYPES:
        return value
    if value.lower() == "null":
        return None
    if kind.startswith(_INT_PREFIXES):
        return _or_raw(int, value)
    if kind.startswith(("num", "float")):
        number = _or_raw(float, value)
        if isinstance(number, float) and number.is_integer():
            return int(number)
        return number
    if kind in ("boolean", "bool", "binary"):
        return value.lower() == "true"
    return _loose_literal(value)


def _schema_type(schema: Any) -> str | None:
    if not isinstance(schema, dict):
        return None
    kind = schema.get("type")
    if isinstance(kind, list):  # ["integer", "null"]: the non-null member decides
        kind = next((k for k in kind if k != "null"), None)
    if kind is None and ("anyOf" in schema or "oneOf" in schema):
        return "object"
    return str(kind).strip().lower() if kind is not None else "string"


def _or_raw(convert: Any, value: str) -> Any:
    try:
        return convert(value)
    except (TypeError, ValueError, OverflowError):
        return value


def _loose_literal(value: str) -> Any:
    """Objects, arrays and unknown types: JSON first, then a Python literal, else the raw text."""
    try:
        return json.loads(value)
    except ValueError:
        pass
    try:
        parsed = ast.literal_eval(value)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return value
    return parsed if isinstance(parsed, (dict, list, str, int, float, bool)) or parsed is None else value
