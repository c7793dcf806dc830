"""What the recorder accepts: every request body is checked before anything converts or renders it.

A malformed request is the client's mistake, so it is answered 4xx in its API's own error shape
(`error_body`), naming the field and what is wrong (`messages[2].content: ...`); it never reaches
a chat template (whose errors would blame the template) or a traceback. The checks cover what
the recorder reads: the body is UTF-8 JSON, an object, nested at most `MAX_DEPTH` deep, with no
lone surrogate in any string (`\\ud800` parses in JSON but is not text any file can hold); then
the fields of each API (`check_anthropic`, `check_openai`): `messages` a non-empty array of
messages with a known role and text or block content, `tools` an array of tool schemas, `system`,
`model`, `max_tokens`, `stream` and `stream_options` of their types.

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


class BadRequest(TraceToolsError):
    """A request the recorder refuses: `status` (4xx), the field (`param`) and what is wrong."""

    def __init__(self, message: str, *, param: str | None = None, status: int = 400):
        super().__init__(f"{param}: {message}" if param else message)
        self.param, self.status = param, status


def error_body(protocol: str, kind: str, message: str, param: str | None = None) -> dict:
    """An error in the API's own shape: OpenAI `{"error": {...}}`, Anthropic `{"type": "error", ...}`."""
    if protocol == "openai":
        return {"error": {"message": message, "type": kind, "param": param, "code": None}}
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
        value = body.get(key)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
            raise BadRequest(f"must be a positive integer, not {_kind(value)}", param=key)


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
