"""The Anthropic Messages API on the recorder's side: requests in, replies out.

Requests become trace-schema messages (OpenAI chat format) the way slime's Anthropic adapter
translates them (docs/probe.md#anthropic-requests--trace-schema-messages), with one difference: the wire ids are
kept (`tool_calls[].id`, the tool message's `tool_call_id`), because a dump's `messages` column
holds what the harness sent; canonicalization (`render/canonical.py`) drops them later, exactly
as slime's translate does.

* A non-leading `role: system` message (Claude Code sends them mid-conversation) is first folded
  into the nearest earlier user message, else the next one, as a `<system-reminder>` text block,
  as slime's adapter does (Qwen-style templates refuse a system message past index 0).
* `system` (text or blocks) becomes a leading system message, blocks joined by newlines.
* A user message: each `tool_result` block becomes its own `tool` message (content flattened),
  each text block its own `user` message.
* An assistant message becomes one message: text blocks joined with "", thinking blocks as
  `reasoning_content`, `tool_use` blocks as tool calls whose arguments are the `input` object
  (key order kept).
* Tools: `{name, description, input_schema}` become OpenAI function schemas.

Replies are built from the parsed generation: a `thinking` block (signed with an opaque
signature, as the API does), a `text` block, one `tool_use` block per call. `sse_events` gives
the streaming event sequence the API sends for that message.
"""

from __future__ import annotations

import base64
import hashlib
import json
from typing import Any, Iterator

from trace_tools.render.canonical import flatten_content

REMINDER_OPEN, REMINDER_CLOSE = "<system-reminder>\n", "\n</system-reminder>\n"


def fold_mid_list_system(messages: list[Any]) -> list[Any]:
    """`messages` with every non-leading system message folded into a user message (a copy)."""
    out = [dict(m) if isinstance(m, dict) else m for m in messages]
    folded: set[int] = set()
    for index, message in enumerate(out):
        if index == 0 or not isinstance(message, dict) or message.get("role") != "system":
            continue
        block = {"type": "text", "text": REMINDER_OPEN + flatten_content(message.get("content")) + REMINDER_CLOSE}
        target = _nearest_user(out, index)
        if target is None:
            out[index] = {"role": "user", "content": [block]}
            continue
        blocks = _as_blocks(out[target].get("content"))
        out[target] = {**out[target], "content": blocks + [block] if target < index else [block] + blocks}
        folded.add(index)
    return [m for i, m in enumerate(out) if i not in folded]


def _nearest_user(messages: list[Any], index: int) -> int | None:
    before = [j for j in range(index - 1, -1, -1) if _is_user(messages[j])]
    after = [j for j in range(index + 1, len(messages)) if _is_user(messages[j])]
    return before[0] if before else (after[0] if after else None)


def _is_user(message: Any) -> bool:
    return isinstance(message, dict) and message.get("role") == "user"


def _as_blocks(content: Any) -> list[Any]:
    if isinstance(content, list):
        return list(content)
    return [{"type": "text", "text": content if isinstance(content, str) else ""}]


def request_messages(body: dict) -> list[dict]:
    """The request's conversation as trace-schema messages (OpenAI chat format, wire ids kept)."""
    out: list[dict] = []
    if body.get("system"):
        out.append({"role": "system", "content": flatten_content(body["system"])})
    for message in fold_mid_list_system(list(body.get("messages") or [])):
        if not isinstance(message, dict):
            continue
        role, content = message.get("role"), message.get("content")
        if role == "user":
            out.extend(_user_messages(content))
        elif role == "assistant":
            out.append(_assistant_message(content))
        elif role == "system":
            out.append({"role": "system", "content": flatten_content(content)})
    return out


def _user_messages(content: Any) -> Iterator[dict]:
    for block in _as_blocks(content):
        if isinstance(block, dict) and block.get("type") == "tool_result":
            yield {
                "role": "tool",
                "tool_call_id": block.get("tool_use_id"),
                "content": flatten_content(block.get("content")),
            }
        elif isinstance(block, dict) and block.get("type") == "text":
            yield {"role": "user", "content": block.get("text", "")}
        else:
            yield {"role": "user", "content": flatten_content([block])}


def _assistant_message(content: Any) -> dict:
    texts, thoughts, calls = [], [], []
    for block in _as_blocks(content):
        if not isinstance(block, dict):
            continue
        kind = block.get("type")
        if kind == "text":
            texts.append(block.get("text", ""))
        elif kind == "thinking":
            thoughts.append(block.get("thinking", ""))
        elif kind == "tool_use":
            function = {"name": block.get("name", "tool"), "arguments": block.get("input") or {}}
            calls.append({"id": block.get("id"), "type": "function", "function": function})
    return chat_assistant(texts, thoughts, calls)


def chat_assistant(texts: list[str], thoughts: list[str], calls: list[dict]) -> dict:
    """An echoed assistant turn as a chat message: its text, its reasoning and its calls, the last
    two only when present (the Messages and Gemini APIs split a turn into such parts alike)."""
    message: dict[str, Any] = {"role": "assistant", "content": "".join(texts)}
    if thoughts:
        message["reasoning_content"] = "".join(thoughts)
    if calls:
        message["tool_calls"] = calls
    return message


def request_tools(body: dict) -> list[dict] | None:
    """The request's tools as OpenAI function schemas (None when it has none)."""
    tools = []
    for tool in body.get("tools") or ():
        if not isinstance(tool, dict) or "name" not in tool:
            continue
        parameters = tool.get("input_schema") or {"type": "object", "properties": {}}
        function = {"name": tool["name"], "description": tool.get("description", ""), "parameters": parameters}
        tools.append({"type": "function", "function": function})
    return tools or None


# -- replies --------------------------------------------------------------------------------------
def tool_use_id(seed: str) -> str:
    """A deterministic `toolu_` id (a recording is reproducible from its script)."""
    return "toolu_" + hashlib.sha256(seed.encode()).hexdigest()[:24]


def signature(thinking: str) -> str:
    """An opaque signature for a thinking block (the API signs them; clients echo it back)."""
    return base64.b64encode(hashlib.sha256(thinking.encode()).digest()).decode()


def reply_blocks(parsed: dict, id_seed: str, *, reasoning_as_text: bool = False) -> list[dict]:
    """Content blocks for a parsed assistant message (OpenAI form, arguments as dicts); the
    reasoning is a signed thinking block, or with `reasoning_as_text` a text block of its own."""
    blocks: list[dict] = []
    if parsed.get("reasoning_content"):
        thought = parsed["reasoning_content"]
        if reasoning_as_text:
            blocks.append({"type": "text", "text": thought})
        else:
            blocks.append({"type": "thinking", "thinking": thought, "signature": signature(thought)})
    if parsed.get("content"):
        blocks.append({"type": "text", "text": parsed["content"]})
    for position, call in enumerate(parsed.get("tool_calls") or ()):
        function = call["function"]
        blocks.append(
            {
                "type": "tool_use",
                "id": tool_use_id(f"{id_seed}/{position}"),
                "name": function["name"],
                "input": function.get("arguments") or {},
            }
        )
    return blocks or [{"type": "text", "text": ""}]


def response_message(blocks: list[dict]) -> dict:
    """The served reply as a trace-schema `response` (OpenAI form, ids and argument objects as sent)."""
    return _assistant_message(blocks)


def stop_reason(blocks: list[dict], finish: str) -> str:
    if any(block["type"] == "tool_use" for block in blocks):
        return "tool_use"
    return "max_tokens" if finish == "length" else "end_turn"


def message_body(message_id: str, model: str, blocks: list[dict], stop: str, usage: dict) -> dict:
    return {
        "id": message_id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": blocks,
        "stop_reason": stop,
        "stop_sequence": None,
        "usage": usage,
    }


def sse_events(message: dict) -> Iterator[tuple[str, dict]]:
    """(event name, data) in the order the API streams a message: message_start, per block
    content_block_start / delta(s) / stop (text_delta, thinking_delta + signature_delta,
    input_json_delta), message_delta with the stop reason and output usage, message_stop."""
    usage = message["usage"]
    start = {**message, "content": [], "stop_reason": None, "usage": {**usage, "output_tokens": 0}}
    yield "message_start", {"type": "message_start", "message": start}
    for index, block in enumerate(message["content"]):
        opening, deltas = _block_stream(block)
        yield "content_block_start", {"type": "content_block_start", "index": index, "content_block": opening}
        for delta in deltas:
            yield "content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta}
        yield "content_block_stop", {"type": "content_block_stop", "index": index}
    final = {"stop_reason": message["stop_reason"], "stop_sequence": None}
    yield "message_delta", {"type": "message_delta", "delta": final, "usage": {"output_tokens": usage["output_tokens"]}}
    yield "message_stop", {"type": "message_stop"}


def _block_stream(block: dict) -> tuple[dict, list[dict]]:
    if block["type"] == "thinking":
        deltas = [{"type": "thinking_delta", "thinking": piece} for piece in pieces(block["thinking"])]
        deltas.append({"type": "signature_delta", "signature": block.get("signature", "")})
        return {"type": "thinking", "thinking": "", "signature": ""}, deltas
    if block["type"] == "tool_use":
        partial = json.dumps(block["input"], ensure_ascii=False)
        opening = {"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}
        return opening, [{"type": "input_json_delta", "partial_json": piece} for piece in pieces(partial)]
    return {"type": "text", "text": ""}, [{"type": "text_delta", "text": piece} for piece in pieces(block["text"])]


def pieces(text: str, size: int = 64) -> list[str]:
    """A text in the chunks a stream would carry (at least one, possibly empty)."""
    return [text[i : i + size] for i in range(0, len(text), size)] or [""]


def sse_frame(event: str, data: dict) -> bytes:
    return f"event: {event}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n".encode()


def is_title_request(body: dict) -> bool:
    """Claude Code's conversation-title request (no tools; its system prompt asks for a title)."""
    return not body.get("tools") and "title" in flatten_content(body.get("system")).lower()
