"""Response parsers for GLM-4.5, DeepSeek V3, gpt-oss (harmony) and Llama 3.1 outputs.

Each one behaves like the serving engine's parser for the family (SGLang's `glm45`,
`deepseekv3`/`deepseekv31`, `gpt-oss` and `llama3` tool-call detectors and the matching reasoning
parsers); they were read to fix the semantics and written anew here. Every function takes the
generated text (stop token removed) and the request's tools, and returns
`(reasoning, content, tool_calls, errors)`; a call that does not parse never raises: it becomes
an error and its raw text stays in the content. The harmony parser alone gets the stop token too:
there it also terminates the last message.

* **glm**: `\\n<think>R</think>\\nC\\n<tool_call>NAME\\n<arg_key>K</arg_key>\\n<arg_value>V</arg_value>\\n
  </tool_call>`. The content before the first call is stripped; keys are stripped, values kept
  verbatim and typed by the request's tool schema (undeclared or string-typed stay text), as
  SGLang's glm45 detector does since it stopped stripping values.
* **deepseek**: reasoning is everything before `</think>` (the generation prompt opens `<think>`
  after a user message, not after tool outputs); calls sit between `<｜tool▁calls▁begin｜>` and
  `<｜tool▁calls▁end｜>`, each `TYPE<｜tool▁sep｜>NAME\\n```json\\nARGS\\n``` ` (V3, what the V3 template
  renders) or `NAME<｜tool▁sep｜>ARGS` (the V3.1 layout); the content before them is stripped.
* **harmony**: messages `[<|start|>assistant]HEADER<|message|>BODY` ended by `<|end|>`, `<|call|>`
  or `<|return|>`. `analysis` is reasoning, `final` (and `commentary` without a recipient) is
  content, `commentary` addressed `to=functions.NAME` is a call with JSON arguments; the recipient
  may sit in the role header (as the template renders it) or in the channel header (as the model
  often writes it), with or without `<|constrain|>json`.
* **llama**: a call is one JSON object `{"name": ..., "parameters": {...}}` (or `"arguments"`),
  optionally after `<|python_tag|>`; several are separated by `;`. Text before the tag is content.
"""

from __future__ import annotations

import json
import re
from typing import Any, Callable, Sequence

from trace_tools.render.parse_common import (
    THINK_CLOSE,
    THINK_OPEN,
    collect_calls,
    convert_parameter,
    schema_properties,
    tool_call,
)

Parsed = tuple[str, str, list[dict], list[str]]
# tool-call format (a family record's `tool_format`) -> its parser; the Qwen formats (json, xml)
# are parsed in `render.parser`.
Parser = Callable[[str, Sequence[dict] | None], Parsed]
PARSERS: dict[str, Parser] = {}


def _parses(tool_format: str) -> Callable[[Parser], Parser]:
    """Register the decorated function as the parser of `tool_format`."""

    def register(parse: Parser) -> Parser:
        PARSERS[tool_format] = parse
        return parse

    return register


# -- GLM ---------------------------------------------------------------------------------------
_GLM_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
_GLM_PAIR = re.compile(r"<arg_key>(.*?)</arg_key>\s*<arg_value>(.*?)</arg_value>", re.DOTALL)


@_parses("glm")
def parse_glm(text: str, tools: Sequence[dict] | None) -> Parsed:
    reasoning, rest = _think_block(text)
    start = rest.find("<tool_call>")
    if start < 0:
        return reasoning, rest.strip(), [], []
    calls, errors, stray = collect_calls(rest, _GLM_CALL, lambda body: _glm_call(body, tools), start)
    return reasoning, _content(rest[:start], stray, ("<tool_call>", "</tool_call>"), errors), calls, errors


def _glm_call(body: str, tools: Sequence[dict] | None) -> dict | str:
    name, _, arguments_text = body.partition("\n")
    if "<arg_key>" in name:  # no newline after the name
        name, arguments_text = name[: name.index("<arg_key>")], body[name.index("<arg_key>") :]
    name = name.strip()
    if not name:
        return "GLM tool call has no function name"
    properties = schema_properties(tools, name)
    arguments: dict[str, Any] = {}
    for pair in _GLM_PAIR.finditer(arguments_text):
        key = pair.group(1).strip()
        arguments[key] = convert_parameter(pair.group(2), properties.get(key))
    if _GLM_PAIR.sub("", arguments_text).strip():
        return f"GLM tool call {name!r} has text outside <arg_key>/<arg_value> pairs"
    return tool_call(name, arguments)


# -- DeepSeek ------------------------------------------------------------------------------------
DS_CALLS_BEGIN, DS_CALLS_END = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
DS_CALL_BEGIN, DS_CALL_END, DS_SEP = "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>"
_DS_CALL = re.compile(re.escape(DS_CALL_BEGIN) + "(.*?)" + re.escape(DS_CALL_END), re.DOTALL)
_DS_V3_BODY = re.compile(r"^(.*?)" + re.escape(DS_SEP) + r"(.*?)\n```json\n(.*)\n```$", re.DOTALL)
_DS_MARKERS = (DS_CALLS_BEGIN, DS_CALLS_END, DS_CALL_BEGIN, DS_CALL_END, DS_SEP)


@_parses("deepseek")
def parse_deepseek(text: str, tools: Sequence[dict] | None) -> Parsed:
    reasoning, rest = _deepseek_reasoning(text)
    start = rest.find(DS_CALLS_BEGIN)
    if start < 0:
        return reasoning, rest.strip(), [], []
    end = rest.find(DS_CALLS_END, start)
    calls, errors, stray = collect_calls(
        rest, _DS_CALL, _deepseek_call, start + len(DS_CALLS_BEGIN), end if end >= 0 else None
    )
    if end < 0:
        errors.append("unterminated <｜tool▁calls▁begin｜>")
    else:
        stray += rest[end + len(DS_CALLS_END) :]
    return reasoning, _content(rest[:start], stray, _DS_MARKERS, errors), calls, errors


def _deepseek_reasoning(text: str) -> tuple[str, str]:
    if THINK_CLOSE in text:
        inner, rest = text.split(THINK_CLOSE, 1)
        inner = inner[inner.index(THINK_OPEN) + len(THINK_OPEN) :] if inner.lstrip().startswith(THINK_OPEN) else inner
        return inner.strip("\n"), rest.lstrip("\n")
    if text.lstrip().startswith(THINK_OPEN):  # cut off while thinking
        return text.lstrip()[len(THINK_OPEN) :].strip("\n"), ""
    return "", text


def _deepseek_call(body: str) -> dict | str:
    v3 = _DS_V3_BODY.match(body)
    name, arguments = (v3.group(2), v3.group(3)) if v3 else body.partition(DS_SEP)[0::2]
    if DS_SEP not in body or not name.strip():
        return "DeepSeek tool call has no <｜tool▁sep｜>NAME"
    return _json_call(name.strip(), arguments, "DeepSeek")


# -- gpt-oss (harmony) ---------------------------------------------------------------------------
_HARMONY_ENDS = ("<|end|>", "<|call|>", "<|return|>")
_HARMONY_SPLIT = re.compile(r"(<\|end\|>|<\|call\|>|<\|return\|>)")
_RECIPIENT = re.compile(r"to=([^\s<]+)")
_CHANNEL = re.compile(r"<\|channel\|>\s*([^\s<]+)")


@_parses("harmony")
def parse_harmony(text: str, tools: Sequence[dict] | None) -> Parsed:
    reasoning, content, calls, errors = [], [], [], []
    for raw, terminated in _harmony_messages(text):
        header, found, body = raw.partition("<|message|>")
        if not found:
            errors.append("harmony message without <|message|>")
            content.append(raw)
            continue
        channel = _CHANNEL.search(header)
        recipient = _RECIPIENT.search(header)
        if recipient is not None:
            call = _harmony_call(recipient.group(1), body, terminated)
            if isinstance(call, str):
                errors.append(call)
                content.append(raw)
            else:
                calls.append(call)
        elif channel is not None and channel.group(1) == "analysis":
            reasoning.append(body)
        else:  # final, or a commentary preamble to the user
            content.append(body)
    return "\n".join(reasoning), "\n".join(content), calls, errors


def _harmony_messages(text: str) -> list[tuple[str, bool]]:
    """(header + body, ended by a terminator) per message; a leading `<|start|>assistant` is dropped.

    `text` keeps the stop token: `<|call|>` / `<|return|>` terminate the last message.
    """
    pieces = _HARMONY_SPLIT.split(text.removesuffix("<|endoftext|>"))
    messages = []
    for index in range(0, len(pieces), 2):
        raw = pieces[index]
        terminated = index + 1 < len(pieces)
        raw = raw.removeprefix("<|start|>").removeprefix("assistant")
        if raw.strip() or terminated:
            messages.append((raw, terminated))
    return messages


def _harmony_call(recipient: str, body: str, terminated: bool) -> dict | str:
    if not terminated:
        return f"harmony call to {recipient} was cut off"
    return _json_call(recipient.split(".", 1)[1] if recipient.startswith("functions.") else recipient, body, "harmony")


# -- Llama 3.1 -----------------------------------------------------------------------------------
PYTHON_TAG = "<|python_tag|>"


@_parses("llama")
def parse_llama(text: str, tools: Sequence[dict] | None) -> Parsed:
    if PYTHON_TAG in text:
        content, action = text.split(PYTHON_TAG, 1)
    elif text.startswith(("{", "[")):
        content, action = "", text
    else:
        return "", text, [], []
    objects, trailing = _json_objects(action)
    calls = [_llama_call(obj) for obj in objects]
    failures = [call for call in calls if isinstance(call, str)]
    if not objects or failures:
        return "", text.strip(), [], [failures[0] if failures else "Llama tool call is not valid JSON"]
    return "", (content + trailing).strip(), [call for call in calls if isinstance(call, dict)], []


def _json_objects(text: str) -> tuple[list[Any], str]:
    """JSON values separated by `;` (a whole array counts as its items), and the unparsed rest."""
    try:
        whole = json.loads(text)
        return (whole if isinstance(whole, list) else [whole]), ""
    except ValueError:
        pass
    decoder, objects, position = json.JSONDecoder(), [], 0
    while position < len(text):
        try:
            value, end = decoder.raw_decode(text, position)
        except ValueError:
            break
        objects.append(value)
        position = end
        while position < len(text) and text[position] in " \n;":
            position += 1
    return objects, text[position:]


def _llama_call(payload: Any) -> dict | str:
    if not isinstance(payload, dict) or not isinstance(payload.get("name"), str):
        return "Llama tool call JSON has no string 'name'"
    arguments = payload.get("parameters", payload.get("arguments", {}))
    if not isinstance(arguments, dict):
        return "Llama tool call parameters are not a JSON object"
    return tool_call(payload["name"], arguments)


# -- shared --------------------------------------------------------------------------------------
def _think_block(text: str) -> tuple[str, str]:
    stripped = text.lstrip("\n")
    if stripped.startswith(THINK_OPEN) and THINK_CLOSE in stripped:
        inner, rest = stripped[len(THINK_OPEN) :].split(THINK_CLOSE, 1)
        return inner.strip(), rest
    return "", text


def _json_call(name: str, arguments_text: str, family: str) -> dict | str:
    try:
        arguments = json.loads(arguments_text) if arguments_text.strip() else {}
    except ValueError as exc:
        return f"{family} tool call arguments are not JSON: {exc}"
    if not isinstance(arguments, dict):
        return f"{family} tool call arguments are not a JSON object"
    return tool_call(name, arguments)


def _content(head: str, stray: str, markers: Sequence[str], errors: list[str]) -> str:
    """The content: the text before the first call, plus whatever was not a well-formed call."""
    content, rest = head.strip(), stray.strip()
    if any(marker in rest for marker in markers) and not errors:
        errors.append("unterminated tool call")
    return f"{content}\n{rest}" if content and rest else content or rest
