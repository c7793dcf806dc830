"""The OpenAI Responses API on the recorder's side (`POST /v1/responses`): requests in, replies out.

Codex CLI speaks only this API. It sends the whole conversation in `input` every turn with
`store: false`, so the recorder keeps no state: a request that names a `previous_response_id` is
refused (400) with a message saying to send the full input instead.

Requests become trace-schema messages (OpenAI chat format, wire ids kept, as the Anthropic path
does; docs/probe.md#responses-requests--trace-schema-messages):

* `instructions` becomes a leading system message; `input` as a string, one user message;
* a `message` item keeps its role (`developer` too: canonicalization renders it as `system`) and
  its text (a string as sent; parts flattened as canonicalization does: joined by newlines);
* an assistant turn is the run of `reasoning`, assistant `message` and `function_call` items
  between two other items: one assistant message with `reasoning_content` (the reasoning item's
  `reasoning_text` content, else the text the recorder sealed in its `encrypted_content`, else its
  summary), `content` (None when the run has no message item, as a served reply with calls alone
  has it), and `tool_calls` (`call_id` as the id, `arguments` as the JSON text sent);
* a `function_call_output` item becomes a `tool` message (`tool_call_id` = its `call_id`);
* tools: `{"type": "function", "name", "description", "parameters"}` become chat function schemas;
  other tool types (Codex's `local_shell`, freeform `custom` tools, `web_search`) have no chat form
  and are left out of the render (the row's `metadata.unrendered_tools` names them).

A reply is the parsed generation as output items: a `reasoning` item (the text as `reasoning_text`
content, and sealed in `encrypted_content`, because a client may echo a reasoning item back with
only its `summary` and `encrypted_content`), a `message` item with one `output_text` part, one
`function_call` item per call. `sse_events` gives the API's streaming event sequence for it.
"""

from __future__ import annotations

import base64
import hashlib
import json
from typing import Any, Iterator

from trace_tools.record.anthropic import pieces
from trace_tools.record.checks import BadRequest
from trace_tools.render.canonical import flatten_content

SEALED = "trace-tools:"  # what marks an encrypted_content the recorder issued (its reasoning, base64)


# -- requests ---------------------------------------------------------------------------------------
def request_messages(body: dict) -> list[dict]:
    """The request's conversation as trace-schema messages (OpenAI chat format, wire ids kept)."""
    out: list[dict] = []
    if body.get("instructions"):
        out.append({"role": "system", "content": body["instructions"]})
    items = body["input"]
    if isinstance(items, str):
        items = [{"role": "user", "content": items}]
    turn: dict | None = None  # the assistant message the current run of items builds
    for item in items:
        kind, role = item.get("type", "message"), item.get("role")
        if kind in ("reasoning", "function_call") or (kind == "message" and role == "assistant"):
            if turn is None or _starts_new_turn(turn, kind):
                turn = {"role": "assistant", "content": None}  # None until a message item brings text
                out.append(turn)
            _add_to_turn(turn, item, kind)
            continue
        turn = None
        if kind == "function_call_output":
            out.append({"role": "tool", "tool_call_id": item["call_id"], "content": flatten_content(item["output"])})
        else:
            out.append({"role": role, "content": flatten_content(item["content"])})
    return out


def _starts_new_turn(turn: dict, kind: str) -> bool:
    """A reasoning item after text or calls, or text after calls, opens the next assistant message."""
    if kind == "reasoning":
        return bool(turn["content"] or turn.get("tool_calls"))
    return kind == "message" and bool(turn.get("tool_calls"))


def _add_to_turn(turn: dict, item: dict, kind: str) -> None:
    if kind == "reasoning":
        thought = reasoning_text(item)
        if thought:
            turn["reasoning_content"] = turn.get("reasoning_content", "") + thought
    elif kind == "message":
        turn["content"] = (turn["content"] or "") + _assistant_text(item["content"])
    else:
        call = {
            "id": item["call_id"],
            "type": "function",
            "function": {"name": item["name"], "arguments": item["arguments"]},
        }
        turn.setdefault("tool_calls", []).append(call)


def _assistant_text(content: Any) -> str:
    """An assistant message's text: a string as sent, its parts (`output_text`, `refusal`) joined."""
    if isinstance(content, str):
        return content
    return "".join(part.get("text") or part.get("refusal") or "" for part in content)


def reasoning_text(item: dict) -> str:
    """What a reasoning item tells the model: its reasoning text, else the text the recorder sealed
    in `encrypted_content` (the model's own reasoning, as a server that issued the blob reads it),
    else its summary."""
    content = "".join(part.get("text") or "" for part in item.get("content") or ())
    if content:
        return content
    sealed = item.get("encrypted_content") or ""
    if sealed.startswith(SEALED):
        try:
            return base64.b64decode(sealed[len(SEALED) :], validate=True).decode("utf-8")
        except ValueError:
            raise BadRequest("is not one the recorder issued", param="encrypted_content") from None
    return "\n".join(part.get("text") or "" for part in item.get("summary") or ())


def request_tools(body: dict) -> tuple[list[dict] | None, list[str]]:
    """The function tools as chat function schemas (None when none), and the other tools' names."""
    tools: list[dict] = []
    other: list[str] = []
    for tool in body.get("tools") or ():
        if tool["type"] != "function":
            other.append(tool["type"] + (f":{tool['name']}" if isinstance(tool.get("name"), str) else ""))
            continue
        parameters = tool.get("parameters") or {"type": "object", "properties": {}}
        function = {"name": tool["name"], "description": tool.get("description") or "", "parameters": parameters}
        tools.append({"type": "function", "function": function})
    return tools or None, other


# -- replies ------------------------------------------------------------------------------------------
def _item_id(prefix: str, seed: str) -> str:
    return prefix + hashlib.sha256(seed.encode()).hexdigest()[:24]


def seal(reasoning: str) -> str:
    return SEALED + base64.b64encode(reasoning.encode("utf-8")).decode("ascii")


def output_items(message: dict, seed: str) -> list[dict]:
    """Output items for a served chat-form message (from `openai_chat.reply_message`)."""
    items: list[dict] = []
    if message.get("reasoning_content"):
        thought = message["reasoning_content"]
        items.append(
            {
                "type": "reasoning",
                "id": _item_id("rs_", seed),
                "summary": [],
                "content": [{"type": "reasoning_text", "text": thought}],
                "encrypted_content": seal(thought),
            }
        )
    if message.get("content") or not message.get("tool_calls"):
        text: dict[str, Any] = {
            "type": "output_text",
            "text": message.get("content") or "",
            "annotations": [],
            "logprobs": [],
        }
        items.append(
            {
                "type": "message",
                "id": _item_id("msg_", seed),
                "role": "assistant",
                "status": "completed",
                "content": [text],
            }
        )
    for call in message.get("tool_calls") or ():
        items.append(
            {
                "type": "function_call",
                "id": _item_id("fc_", f"{seed}/{call['index']}"),
                "call_id": call["id"],
                "name": call["function"]["name"],
                "arguments": call["function"]["arguments"],
                "status": "completed",
            }
        )
    return items


def response_body(
    response_id: str, body: dict, created: int, items: list[dict], finish: str, usage: tuple[int, int]
) -> dict:
    """The Response object: `completed`, or `incomplete` when the generation hit its token limit."""
    prompt, generated = usage
    truncated = finish == "length"
    return {
        "id": response_id,
        "object": "response",
        "created_at": created,
        "status": "incomplete" if truncated else "completed",
        "error": None,
        "incomplete_details": {"reason": "max_output_tokens"} if truncated else None,
        "instructions": body.get("instructions"),
        "max_output_tokens": body.get("max_output_tokens"),
        "model": body.get("model", ""),
        "output": items,
        "parallel_tool_calls": body.get("parallel_tool_calls", True),
        "previous_response_id": None,
        "store": body.get("store", False),
        "tool_choice": body.get("tool_choice", "auto"),
        "tools": body.get("tools") or [],
        "usage": {
            "input_tokens": prompt,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": generated,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": prompt + generated,
        },
        "metadata": {},
    }


def sse_events(response: dict) -> Iterator[dict]:
    """The events the API streams for `response`, numbered: response.created, response.in_progress,
    per output item output_item.added, its deltas (reasoning_text, content_part + output_text,
    function_call_arguments) and their done events, output_item.done; then response.completed (or
    response.incomplete)."""
    opening = {**response, "status": "in_progress", "output": [], "usage": None, "incomplete_details": None}
    events: list[dict] = [
        {"type": "response.created", "response": opening},
        {"type": "response.in_progress", "response": opening},
    ]
    for index, item in enumerate(response["output"]):
        events.extend(_item_events(index, item))
    final = "response.incomplete" if response["status"] == "incomplete" else "response.completed"
    events.append({"type": final, "response": response})
    for number, event in enumerate(events):
        yield {**event, "sequence_number": number}


def _item_events(index: int, item: dict) -> Iterator[dict]:
    where = {"item_id": item["id"], "output_index": index}
    if item["type"] == "reasoning":
        text = item["content"][0]["text"]
        yield {
            "type": "response.output_item.added",
            "output_index": index,
            "item": {**item, "content": [], "encrypted_content": None},
        }
        for piece in pieces(text):
            yield {"type": "response.reasoning_text.delta", **where, "content_index": 0, "delta": piece}
        yield {"type": "response.reasoning_text.done", **where, "content_index": 0, "text": text}
    elif item["type"] == "message":
        part = item["content"][0]
        yield {
            "type": "response.output_item.added",
            "output_index": index,
            "item": {**item, "status": "in_progress", "content": []},
        }
        yield {"type": "response.content_part.added", **where, "content_index": 0, "part": {**part, "text": ""}}
        for piece in pieces(part["text"]):
            yield {"type": "response.output_text.delta", **where, "content_index": 0, "delta": piece, "logprobs": []}
        yield {"type": "response.output_text.done", **where, "content_index": 0, "text": part["text"], "logprobs": []}
        yield {"type": "response.content_part.done", **where, "content_index": 0, "part": part}
    else:
        opening = {**item, "arguments": "", "status": "in_progress"}
        yield {"type": "response.output_item.added", "output_index": index, "item": opening}
        for piece in pieces(item["arguments"]):
            yield {"type": "response.function_call_arguments.delta", **where, "delta": piece}
        yield {
            "type": "response.function_call_arguments.done",
            **where,
            "name": item["name"],
            "arguments": item["arguments"],
        }
    yield {"type": "response.output_item.done", "output_index": index, "item": item}


def sse_frame(event: dict) -> bytes:
    return f"event: {event['type']}\ndata: {json.dumps(event, ensure_ascii=False)}\n\n".encode()
