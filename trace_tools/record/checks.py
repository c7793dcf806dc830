"""What the recorder accepts: every request body is checked before anything converts or renders it.

A malformed request is the client's mistake, so it is answered 4xx in its API's own error shape
(`error_body`), naming the field and what is wrong (`messages[2].content: ...`); it never reaches
a chat template (whose errors would blame the template) or a traceback. The checks cover what
the recorder reads: the body is UTF-8 JSON, an object, nested at most `MAX_DEPTH` deep, with no
lone surrogate in any string (`\\ud800` parses in JSON but is not text any file can hold); then
the fields of each API (`check_anthropic`, `check_openai`): `messages` a non-empty array of
messages with a known role and text or block content, `tools` an array of tool schemas, `system`,
`model`, `max_tokens`, `stream` and `stream_options` of their types; for the Responses API
(`check_responses`) `input` a string or an array of the item types the recorder reads, and for
Gemini (`check_gemini`) `contents` an array of contents whose parts are text, `functionCall` or
`functionResponse`, `tools[].functionDeclarations` and `generationConfig.maxOutputTokens`.

The server adds the two limits that bound one request's cost before any of this runs (a body
larger than `--max-body` is answered 413 without reading it; a body not received within
`BODY_SECONDS` is answered 408) and turns a render past the template limits into a 400.
"""

from __future__ import annotations

import json
from typing import Any

from trace_tools.errors import TraceToolsError

DEFAULT_MAX_BODY = 16 * 2**20  # bytes: the template output limit is 16 Mi characters anyway
BODY_SECONDS = 60.0  # to receive a whole body once its headers arrived
MAX_DEPTH = 100  # JSON nesting: real requests (a tool's schema inside a request) stay under 20

OPENAI_ROLES = ("system", "developer", "user", "assistant", "tool", "function")
ANTHROPIC_ROLES = ("user", "assistant", "system")  # Claude Code sends mid-list system messages
RESPONSES_ROLES = ("user", "assistant", "system", "developer")
RESPONSES_ITEMS = ("message", "function_call", "function_call_output", "reasoning")
GEMINI_ROLES = ("user", "model", "function")
GEMINI_STATUS = {400: "INVALID_ARGUMENT", 404: "NOT_FOUND", 408: "DEADLINE_EXCEEDED", 413: "INVALID_ARGUMENT"}


class BadRequest(TraceToolsError):
    """A request the recorder refuses: `status` (4xx), the field (`param`) and what is wrong."""

    def __init__(self, message: str, *, param: str | None = None, status: int = 400):
        super().__init__(f"{param}: {message}" if param else message)
        self.param, self.status = param, status


def error_body(protocol: str, kind: str, message: str, param: str | None = None, status: int = 400) -> dict:
    """An error in the API's own shape: OpenAI (Chat Completions and Responses) `{"error": {...}}`,
    Anthropic `{"type": "error", ...}`, Gemini `{"error": {"code", "message", "status"}}`."""
    if protocol in ("openai", "responses"):
        return {"error": {"message": message, "type": kind, "param": param, "code": None}}
    if protocol == "gemini":
        return {"error": {"code": status, "message": message, "status": GEMINI_STATUS.get(status, "INTERNAL")}}
    return {"type": "error", "error": {"type": kind, "message": message}}


# -- the body -----------------------------------------------------------------------------------------
def parse_body(raw: bytes) -> dict:
    """The body as a JSON object whose every string is text and whose nesting is bounded."""
    try:
        body = json.loads(raw or b"{}")
    except RecursionError:
        raise BadRequest(f"the request body nests JSON deeper than {MAX_DEPTH} levels") from None
    except ValueError as exc:
        raise BadRequest(f"the request body is not UTF-8 JSON: {exc}") from None
    if not isinstance(body, dict):
        raise BadRequest(f"the request body must be a JSON object, not {_kind(body)}")
    check_values(body)
    return body


def check_values(body: dict) -> None:
    """Refuse nesting past `MAX_DEPTH` and lone surrogates, naming where (one pass, no recursion)."""
    stack: list[tuple[Any, Any, int]] = [(body, None, 1)]  # (value, its (parent, key) trail, depth)
    while stack:
        value, trail, depth = stack.pop()
        if isinstance(value, str):
            _check_text(value, trail)
            continue
        if not isinstance(value, (dict, list)):
            continue
        if depth > MAX_DEPTH:
            raise BadRequest(f"JSON nested deeper than {MAX_DEPTH} levels", param=_path(trail))
        items = value.items() if isinstance(value, dict) else enumerate(value)
        for key, item in items:
            if isinstance(key, str):
                _check_text(key, (trail, key))
            stack.append((item, (trail, key), depth + 1))


def _check_text(text: str, trail: Any) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        bad = ascii(text[exc.start : exc.end])
        raise BadRequest(
            f"holds a lone surrogate {bad}, which is not text; send valid UTF-16 pairs", param=_path(trail)
        )


def _path(trail: Any) -> str:
    parts: list[str] = []
    while trail is not None:
        trail, key = trail
        parts.append(f"[{key}]" if isinstance(key, int) else f".{key}")
    return "".join(reversed(parts)).lstrip(".") or "body"


# -- the fields ------------------------------------------------------------------------------------------
def check_anthropic(body: dict, *, count_tokens: bool = False) -> None:
    """An Anthropic Messages (or count_tokens) request: the fields the recorder reads."""
    system = body.get("system")
    if system is not None and not isinstance(system, str):
        _blocks(system, "system")
    for i, message in enumerate(_messages(body)):
        where = f"messages[{i}]"
        _role(message, where, ANTHROPIC_ROLES)
        content = message.get("content")
        if not isinstance(content, str):
            _blocks(content, f"{where}.content")
    for i, tool in enumerate(_tools(body)):
        _string(tool, "name", f"tools[{i}]", required=True)
        _string(tool, "description", f"tools[{i}]")
        _object_field(tool, "input_schema", f"tools[{i}]")
    _common(body, () if count_tokens else ("max_tokens",))


def check_openai(body: dict) -> None:
    """An OpenAI Chat Completions request: the fields the recorder reads."""
    for i, message in enumerate(_messages(body)):
        where = f"messages[{i}]"
        _role(message, where, OPENAI_ROLES)
        content = message.get("content")
        if content is not None and not isinstance(content, str):
            _blocks(content, f"{where}.content")
        for key in ("reasoning_content", "tool_call_id", "name"):
            _string(message, key, where)
        for j, call in enumerate(_list_field(message, "tool_calls", where)):
            _function(call, f"{where}.tool_calls[{j}]", "arguments", (str, dict))
    for i, tool in enumerate(_tools(body)):
        _function(tool, f"tools[{i}]", "parameters", (dict,))
    _common(body, ("max_tokens", "max_completion_tokens"))
    options = body.get("stream_options")
    if options is not None:
        if not isinstance(options, dict):
            raise BadRequest(
                f'must be an object such as {{"include_usage": true}}, not {_kind(options)}', param="stream_options"
            )
        _typed(options, "include_usage", "stream_options", bool, "true or false")


def check_responses(body: dict) -> None:
    """An OpenAI Responses request: the fields the recorder reads. The recorder keeps no responses,
    so `previous_response_id` is refused with what to send instead."""
    if body.get("previous_response_id") is not None:
        raise BadRequest(
            "the recorder keeps no responses; send the whole conversation in `input` (with store: false, "
            "as Codex CLI does) instead of a previous_response_id",
            param="previous_response_id",
        )
    items = body.get("input")
    if not isinstance(items, str):
        if not isinstance(items, list) or not items:
            raise BadRequest(f"must be a string or a non-empty array of input items, not {_kind(items)}", param="input")
        for i, item in enumerate(items):
            _responses_item(item, f"input[{i}]")
    for i, tool in enumerate(_tools(body)):
        _string(tool, "type", f"tools[{i}]", required=True)
        if tool["type"] == "function":
            _string(tool, "name", f"tools[{i}]", required=True)
            _object_field(tool, "parameters", f"tools[{i}]")
    _string(body, "instructions", "")
    _common(body, ("max_output_tokens",))


def _responses_item(item: Any, where: str) -> None:
    if not isinstance(item, dict):
        raise BadRequest(f"must be an input item object, not {_kind(item)}", param=where)
    kind = item.get("type", "message")
    if kind not in RESPONSES_ITEMS:
        named = json.dumps(kind) if isinstance(kind, str) else _kind(kind)
        raise BadRequest(f"has type {named}; the recorder reads {', '.join(RESPONSES_ITEMS)}", param=where)
    if kind == "message":
        _role(item, where, RESPONSES_ROLES)
        if not isinstance(item.get("content"), str):
            _blocks(item.get("content"), f"{where}.content")
    elif kind == "function_call":
        for key in ("name", "arguments", "call_id"):
            _string(item, key, where, required=True)
    elif kind == "function_call_output":
        _string(item, "call_id", where, required=True)
        if not isinstance(item.get("output"), str):
            _blocks(item.get("output"), f"{where}.output")
    else:
        for key in ("summary", "content"):
            if item.get(key) is not None:
                _blocks(item[key], f"{where}.{key}")
        _string(item, "encrypted_content", where)


def check_gemini(body: dict, *, count_tokens: bool = False) -> None:
    """A Gemini generateContent (or countTokens) request: the fields the recorder reads."""
    if count_tokens and isinstance(body.get("generateContentRequest"), dict):
        body = body["generateContentRequest"]
    contents = body.get("contents")
    if not isinstance(contents, list) or not contents:
        raise BadRequest(f"must be a non-empty array of contents, not {_kind(contents)}", param="contents")
    for i, content in enumerate(contents):
        if not isinstance(content, dict):
            raise BadRequest(f"must be a content object, not {_kind(content)}", param=f"contents[{i}]")
        if content.get("role") is not None:
            _role(content, f"contents[{i}]", GEMINI_ROLES)
        _gemini_parts(content, f"contents[{i}]")
    system = body.get("systemInstruction")
    if system is not None and not isinstance(system, str):
        if not isinstance(system, dict):
            raise BadRequest(f"must be a content object, not {_kind(system)}", param="systemInstruction")
        _gemini_parts(system, "systemInstruction")
    for i, tool in enumerate(_tools(body)):
        for j, declaration in enumerate(_list_field(tool, "functionDeclarations", f"tools[{i}]")):
            where = f"tools[{i}].functionDeclarations[{j}]"
            if not isinstance(declaration, dict):
                raise BadRequest(f"must be a function declaration object, not {_kind(declaration)}", param=where)
            _string(declaration, "name", where, required=True)
            _object_field(declaration, "parameters", where)
            _object_field(declaration, "parametersJsonSchema", where)
    _object_field(body, "generationConfig", "")
    _positive((body.get("generationConfig") or {}).get("maxOutputTokens"), "generationConfig.maxOutputTokens")


def _gemini_parts(content: dict, where: str) -> None:
    parts = _list_field(content, "parts", where)
    for i, part in enumerate(parts):
        at = f"{where}.parts[{i}]"
        if not isinstance(part, dict):
            raise BadRequest(f"must be a part object, not {_kind(part)}", param=at)
        _string(part, "text", at)
        for key, payload in (("functionCall", "args"), ("functionResponse", "response")):
            if key in part:
                if not isinstance(part[key], dict):
                    raise BadRequest(f"must be an object, not {_kind(part[key])}", param=f"{at}.{key}")
                _string(part[key], "name", f"{at}.{key}", required=True)
                _object_field(part[key], payload, f"{at}.{key}")


def _messages(body: dict) -> list:
    messages = body.get("messages")
    if messages is None:
        raise BadRequest("is required: a non-empty array of messages", param="messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest(f"must be a non-empty array of messages, not {_kind(messages)}", param="messages")
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise BadRequest(f"must be a message object, not {_kind(message)}", param=f"messages[{i}]")
    return messages


def _role(message: dict, where: str, roles: tuple[str, ...]) -> None:
    role = message.get("role")
    if role not in roles:
        raise BadRequest(f"must be one of {', '.join(roles)}, not {_kind(role)}", param=f"{where}.role")


def _blocks(value: Any, where: str) -> None:
    """Content as an array of blocks, each an object with a string `type` (text blocks: a string `text`)."""
    if not isinstance(value, list):
        raise BadRequest(f"must be a string or an array of content blocks, not {_kind(value)}", param=where)
    for i, block in enumerate(value):
        if not isinstance(block, dict) or not isinstance(block.get("type"), str):
            raise BadRequest("must be a content block: an object with a string 'type'", param=f"{where}[{i}]")
        if block["type"] == "text":
            _string(block, "text", f"{where}[{i}]", required=True)
        elif block["type"] == "tool_use":
            _string(block, "name", f"{where}[{i}]", required=True)
            _object_field(block, "input", f"{where}[{i}]")
        elif block["type"] == "thinking":
            _string(block, "thinking", f"{where}[{i}]")
        elif block["type"] == "tool_result" and not isinstance(block.get("content"), (str, type(None))):
            _blocks(block["content"], f"{where}[{i}].content")


def _tools(body: dict) -> list:
    tools = body.get("tools")
    if tools is None:
        return []
    if not isinstance(tools, list):
        raise BadRequest(f"must be an array of tool schemas, not {_kind(tools)}", param="tools")
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict):
            raise BadRequest(f"must be a tool schema object, not {_kind(tool)}", param=f"tools[{i}]")
    return tools


def _function(holder: dict, where: str, payload: str, payload_types: tuple[type, ...]) -> None:
    """`{"type": "function", "function": {"name": ..., PAYLOAD: ...}}` (a tool, or a tool call)."""
    if not isinstance(holder, dict):
        raise BadRequest(f"must be an object, not {_kind(holder)}", param=where)
    function = holder.get("function")
    if not isinstance(function, dict):
        raise BadRequest(
            f'must be an object {{"name": ..., "{payload}": ...}}, not {_kind(function)}', param=f"{where}.function"
        )
    _string(function, "name", f"{where}.function", required=True)
    value = function.get(payload)
    if value is not None and not isinstance(value, payload_types):
        kinds = " or ".join("a string" if t is str else "an object" for t in payload_types)
        raise BadRequest(f"must be {kinds}, not {_kind(value)}", param=f"{where}.function.{payload}")


def _common(body: dict, token_limits: tuple[str, ...]) -> None:
    _string(body, "model", "")
    _typed(body, "stream", "", bool, "true or false")
    for key in token_limits:
        _positive(body.get(key), key)


def _positive(value: Any, param: str) -> None:
    if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
        raise BadRequest(f"must be a positive integer, not {_kind(value)}", param=param)


def _list_field(holder: dict, key: str, where: str) -> list:
    value = holder.get(key)
    if value is None:
        return []
    if not isinstance(value, list):
        raise BadRequest(f"must be an array, not {_kind(value)}", param=f"{where}.{key}")
    return value


def _string(holder: dict, key: str, where: str, *, required: bool = False) -> None:
    value = holder.get(key)
    if value is None and not required:
        return
    if not isinstance(value, str):
        raise BadRequest(f"must be a string, not {_kind(value)}", param=_join(where, key))


def _object_field(holder: dict, key: str, where: str) -> None:
    value = holder.get(key)
    if value is not None and not isinstance(value, dict):
        raise BadRequest(f"must be an object, not {_kind(value)}", param=_join(where, key))


def _typed(holder: dict, key: str, where: str, kind: type, wanted: str) -> None:
    value = holder.get(key)
    if value is not None and not isinstance(value, kind):
        raise BadRequest(f"must be {wanted}, not {_kind(value)}", param=_join(where, key))


def _join(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key


def _kind(value: Any) -> str:
    """How an error names a value: its JSON type, and the value when short."""
    if value is None:
        return "null"
    names = {dict: "an object", list: "an array", str: "a string", bool: "a boolean"}
    name = names.get(type(value), "a number")
    if isinstance(value, (dict, list)):
        return f"{name} of {len(value)}" if value else f"an empty {name.split(' ')[1]}"
    text = json.dumps(value, ensure_ascii=True)
    return f"{name} {text}" if len(text) <= 40 else name
