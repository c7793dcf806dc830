"""Parse generated text into an OpenAI-style assistant message.

The Qwen formats live here; GLM-4.5, DeepSeek V3, gpt-oss (harmony) and Llama 3.1 outputs are
parsed by `family_parsers` (`parse_response_text` dispatches on `fmt`). Two tool-call formats exist
among the Qwen templates:

* `json` (Qwen3): `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`;
* `xml` (Qwen3-Coder / Qwen3.5): `<tool_call>\\n<function=NAME>\\n<parameter=P>\\nVALUE\\n</parameter>\\n
  </function>\\n</tool_call>`. Values are text; the request's tool schemas give them types the way
  the upstream Qwen3-Coder parser does (docs/rendering.md#chat-templates-and-the-response-parser).

Reasoning sits in `<think>...</think>`; with `reasoning_open` the generation prompt already opened
it (the Qwen3.5 think template), so the text starts inside the reasoning. A malformed call never
raises: the message gets `ill_formed=True` and the raw call text stays in `content`.
"""

from __future__ import annotations

import json
import re
from typing import Any, Sequence

from trace_tools.render.base import ParsedResponse
from trace_tools.render.family_parsers import PARSERS
from trace_tools.render.parse_common import (
    THINK_CLOSE,
    THINK_OPEN,
    collect_calls,
    convert_parameter,
    schema_properties,
    tool_call,
)

STOP_STRINGS = ("<|im_end|>", "<|endoftext|>")
CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
_CALL_BLOCK = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
_XML_FUNCTION = re.compile(r"^\s*<function=([^>\n]+)>(.*?)</function>\s*$", re.DOTALL)
_XML_PARAMETER = re.compile(r"<parameter=([^>\n]+)>(.*?)</parameter>", re.DOTALL)


def parse_response_text(
    text: str,
    *,
    fmt: str | None,
    tools: Sequence[dict] | None = None,
    reasoning_open: bool = False,
    stop_strings: Sequence[str] = STOP_STRINGS,
) -> ParsedResponse:
    """Split `text` into reasoning, content and tool calls.

    `fmt` is a tool-call format (`families.TOOL_FORMATS`: json, xml, glm, deepseek, harmony,
    llama) or None for a template without tool calls (then only reasoning is split off).
    """
    errors: list[str] = []
    if fmt == "harmony":  # the stop token (<|call|> or <|return|>) is also the last message's terminator
        reasoning, content, calls, errors = PARSERS[fmt](text, tools)
    elif fmt in PARSERS:
        reasoning, content, calls, errors = PARSERS[fmt](strip_stop(text, stop_strings), tools)
    else:
        reasoning, rest = split_reasoning(strip_stop(text, stop_strings), reasoning_open)
        content, calls = _split_calls(rest, fmt, tools, errors) if fmt in ("json", "xml") else (rest, [])
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if reasoning:
        message["reasoning_content"] = reasoning
    if calls:
        message["tool_calls"] = calls
    return ParsedResponse(message=message, ill_formed=bool(errors), errors=errors)


def strip_stop(text: str, stop_strings: Sequence[str] = STOP_STRINGS) -> str:
    """Drop the stop token(s) the engine kept at the end of the output."""
    changed = True
    while changed:
        changed = False
        for stop in stop_strings:
            if stop and text.endswith(stop):
                text, changed = text[: -len(stop)], True
    return text


def split_reasoning(text: str, reasoning_open: bool) -> tuple[str, str]:
    """(reasoning, remainder). The newlines the templates put around reasoning are removed."""
    if reasoning_open:
        if THINK_CLOSE not in text:
            return text.strip("\n"), ""  # cut off while still thinking
        inner, rest = text.split(THINK_CLOSE, 1)
        return inner.strip("\n"), rest.lstrip("\n")
    stripped = text.lstrip("\n")
    if stripped.startswith(THINK_OPEN) and THINK_CLOSE in stripped:
        inner, rest = stripped[len(THINK_OPEN) :].split(THINK_CLOSE, 1)
        return inner.strip("\n"), rest.lstrip("\n")
    return "", text


def _split_calls(text: str, fmt: str, tools: Sequence[dict] | None, errors: list[str]) -> tuple[str, list[dict]]:
    start = text.find(CALL_OPEN)
    if start < 0:
        return (text.strip() if fmt == "xml" else text), []
    # The templates put one separator between content and the first call: "\n" (json) or
    # "\n\n" after trimmed content (xml).
    content = text[:start]
    content = content.strip() if fmt == "xml" else _drop_one_newline(content)
    parse = _parse_json_call if fmt == "json" else (lambda body: _parse_xml_call(body, tools))
    calls, bad, stray = collect_calls(text, _CALL_BLOCK, parse, start)
    errors.extend(bad)
    if CALL_OPEN in stray or CALL_CLOSE in stray:
        errors.append("unterminated <tool_call>")
    if stray.strip():
        # Keep whatever was not a well-formed call (raw text of a bad call included).
        content = f"{content}\n{stray.strip()}" if content else stray.strip()
    return content, calls


def _drop_one_newline(text: str) -> str:
    return text[:-1] if text.endswith("\n") else text


def _parse_json_call(body: str) -> dict | str:
    try:
        payload = json.loads(body.strip())
    except ValueError as exc:
        return f"tool call is not valid JSON: {exc}"
    if not isinstance(payload, dict) or not isinstance(payload.get("name"), str):
        return "tool call JSON has no string 'name'"
    arguments = payload.get("arguments", {})
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return "tool call arguments are a string that is not JSON"
    if not isinstance(arguments, dict):
        return "tool call arguments are not a JSON object"
    return tool_call(payload["name"], arguments)


def _parse_xml_call(body: str, tools: Sequence[dict] | None) -> dict | str:
    match = _XML_FUNCTION.match(body)
    if match is None:
        return "tool call has no <function=...>...</function> block"
    name, inner = match.group(1).strip(), match.group(2)
    properties = schema_properties(tools, name)
    arguments: dict[str, Any] = {}
    for parameter in _XML_PARAMETER.finditer(inner):
        key = parameter.group(1).strip()
        arguments[key] = convert_parameter(_trim_format_newlines(parameter.group(2)), properties.get(key))
    if _XML_PARAMETER.sub("", inner).strip():
        return f"tool call {name!r} has text outside <parameter=...> blocks"
    return tool_call(name, arguments)


def _trim_format_newlines(value: str) -> str:
    # The format wraps every value in exactly one newline on each side; anything else is data.
    if value.startswith("\n"):
        value = value[1:]
    if value.endswith("\n"):
        value = value[:-1]
    return value
