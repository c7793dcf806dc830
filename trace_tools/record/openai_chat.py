"""The OpenAI Chat Completions API on the recorder's side: requests in, replies out.

A request's `messages` and `tools` already are trace-schema v1's format; they are recorded as
sent. A reply is the parsed generation as SGLang's OpenAI server returns it: `content` (None
when the turn is only tool calls), `reasoning_content` when the family's parser split reasoning
off, and `tool_calls` with an id, an `index` and the arguments as JSON text in the model's key
order. `chunks` gives the streaming form: a role chunk, reasoning and content deltas, one chunk
per tool call (name and id first, then the arguments), a finish chunk, then `[DONE]`.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Iterator


def call_id(seed: str) -> str:
    """A deterministic `call_` id (a recording is reproducible from its script)."""
    return "call_" + hashlib.sha256(seed.encode()).hexdigest()[:24]


def reply_message(parsed: dict, id_seed: str) -> dict:
    """The wire assistant message for a parsed generation (arguments as JSON text)."""
    calls = parsed.get("tool_calls") or []
    message: dict[str, Any] = {"role": "assistant", "content": parsed.get("content") or (None if calls else "")}
    if parsed.get("reasoning_content"):
        message["reasoning_content"] = parsed["reasoning_content"]
    if calls:
        message["tool_calls"] = [
            {
                "id": call_id(f"{id_seed}/{position}"),
                "index": position,
                "type": "function",
                "function": {
                    "name": call["function"]["name"],
                    "arguments": json.dumps(call["function"].get("arguments") or {}, ensure_ascii=False),
                },
            }
            for position, call in enumerate(calls)
        ]
    return message


def reasoning_in_content(message: dict) -> dict:
    """The reply with its reasoning as plain text ahead of the content (a blank line between), as a
    gateway that does not return reasoning separately sends it."""
    reasoning = message.get("reasoning_content")
    if not reasoning:
        return message
    out = {key: value for key, value in message.items() if key != "reasoning_content"}
    out["content"] = f"{reasoning}\n\n{message.get('content') or ''}".rstrip("\n")
    return out


def finish_reason(message: dict, finish: str) -> str:
    if message.get("tool_calls"):
        return "tool_calls"
    return "length" if finish == "length" else "stop"


def completion_body(completion_id: str, model: str, created: int, message: dict, finish: str, usage: dict) -> dict:
    return {
        "id": completion_id,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": finish, "logprobs": None}],
        "usage": usage,
    }


def chunks(body: dict, include_usage: bool) -> Iterator[dict]:
    """The streamed chunks of a completion body, in the order an OpenAI-compatible server sends them."""
    choice = body["choices"][0]
    message = choice["message"]

    def chunk(delta: dict, finish: str | None = None) -> dict:
        return {
            "id": body["id"],
            "object": "chat.completion.chunk",
            "created": body["created"],
            "model": body["model"],
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}],
        }

    yield chunk({"role": "assistant", "content": ""})
    if message.get("reasoning_content"):
        yield chunk({"reasoning_content": message["reasoning_content"]})
    if message.get("content"):
        yield chunk({"content": message["content"]})
    for call in message.get("tool_calls") or ():
        head = {"index": call["index"], "id": call["id"], "type": "function"}
        yield chunk({"tool_calls": [{**head, "function": {"name": call["function"]["name"], "arguments": ""}}]})
        yield chunk(
            {"tool_calls": [{"index": call["index"], "function": {"arguments": call["function"]["arguments"]}}]}
        )
    yield chunk({}, choice["finish_reason"])
    if include_usage:
        yield {**chunk({}), "choices": [], "usage": body["usage"]}


def sse_frame(data: dict | str) -> bytes:
    text = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)
    return f"data: {text}\n\n".encode()
