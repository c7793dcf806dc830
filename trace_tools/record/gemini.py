"""Google's Gemini API on the recorder's side: requests in, replies out.

Gemini CLI speaks only this API: `POST /v1beta/models/{model}:generateContent`,
`:streamGenerateContent` (`?alt=sse`: Server-Sent Events; without it one JSON array) and
`:countTokens`. The model is named in the path, not the body.

Requests become trace-schema messages (OpenAI chat format, wire ids kept, as the Anthropic path
does; docs/probe.md#gemini-requests--trace-schema-messages):

* `systemInstruction` (a content, or text) becomes a leading system message, its text parts joined
  by newlines;
* a `user` (or `function`) content, part by part: each run of text parts becomes one user message
  (one part: its text; several: a list of text parts, which canonicalization joins by newlines),
  each `functionResponse` part a `tool` message whose content is the `response` object as JSON
  text (`tool_call_id` = its `id`, `name` kept); other parts (inline data, files) are not rendered;
* a `model` content becomes one assistant message: `thought: true` text parts as
  `reasoning_content`, other text parts joined as `content`, `functionCall` parts as tool calls
  (`args` the arguments object, key order kept; `id` as the call id when the client sent one);
* tools: each `functionDeclarations` entry becomes a chat function schema; `parametersJsonSchema`
  is used as it is, `parameters` (Gemini's OpenAPI subset) with its upper-case type names
  lower-cased (`OBJECT` → `object`). Other tools (search, code execution) have no chat form and are
  left out of the render (`metadata.unrendered_tools`).

A reply is the parsed generation as one candidate: a `thought` text part for the reasoning, a text
part, one `functionCall` part per call (with an id, which Gemini CLI echoes back in its
`functionResponse`), `finishReason` `STOP` (also for tool calls, as the API does) or `MAX_TOKENS`,
and `usageMetadata`. A stream sends one chunk per part, the last carrying the finish reason and
the usage.
"""

from __future__ import annotations

import json
from typing import Any, Iterator

from trace_tools.record.anthropic import chat_assistant

METHODS = ("generateContent", "streamGenerateContent", "countTokens")
_PREFIXES = ("/v1beta/models/", "/v1/models/", "/v1alpha/models/")


def route(path: str) -> tuple[str, str] | None:
    """(`model`, `method`) for `/v1beta/models/MODEL:METHOD` (also `/v1/`, `/v1alpha/`); None otherwise."""
    prefix = next((p for p in _PREFIXES if path.startswith(p)), None)
    if prefix is None:
        return None
    model, _, method = path[len(prefix) :].rpartition(":")
    return (model, method) if model and method in METHODS else None


def request_messages(body: dict) -> list[dict]:
    """The request's conversation as trace-schema messages (OpenAI chat format, wire ids kept)."""
    out: list[dict] = []
    system = body.get("systemInstruction")
    if system:
        text = (
            system
            if isinstance(system, str)
            else "\n".join(p["text"] for p in system.get("parts") or () if _has_text(p))
        )
        out.append({"role": "system", "content": text})
    for content in body["contents"]:
        parts = content.get("parts") or []
        if content.get("role") == "model":
            out.append(_assistant_message(parts))
        else:
            out.extend(_user_messages(parts))
    return out


def _user_messages(parts: list[dict]) -> Iterator[dict]:
    """User text and tool results in the order of the parts: each run of text parts one user message,
    each `functionResponse` a tool message."""
    texts: list[str] = []
    for part in parts:
        if _has_text(part):
            texts.append(part["text"])
            continue
        answer = part.get("functionResponse")
        if answer is None:
            continue
        if texts:
            yield _user_text(texts)
            texts = []
        text = json.dumps(answer.get("response") or {}, ensure_ascii=False)
        yield {"role": "tool", "tool_call_id": answer.get("id"), "name": answer["name"], "content": text}
    if texts:
        yield _user_text(texts)


def _has_text(part: dict) -> bool:
    return isinstance(part.get("text"), str)  # a part's `text` may be sent as null


def _user_text(texts: list[str]) -> dict:
    content: Any = texts[0] if len(texts) == 1 else [{"type": "text", "text": text} for text in texts]
    return {"role": "user", "content": content}


def _assistant_message(parts: list[dict]) -> dict:
    thoughts = [p["text"] for p in parts if _has_text(p) and p.get("thought")]
    texts = [p["text"] for p in parts if _has_text(p) and not p.get("thought")]
    calls = [
        {
            "id": p["functionCall"].get("id"),
            "type": "function",
            "function": {"name": p["functionCall"]["name"], "arguments": p["functionCall"].get("args") or {}},
        }
        for p in parts
        if "functionCall" in p
    ]
    return chat_assistant(texts, thoughts, calls)


def request_tools(body: dict) -> tuple[list[dict] | None, list[str]]:
    """The function declarations as chat function schemas (None when none), and the other tools' kinds."""
    tools: list[dict] = []
    other: list[str] = []
    for tool in body.get("tools") or ():
        other.extend(key for key in tool if key != "functionDeclarations")
        for declaration in tool.get("functionDeclarations") or ():
            schema = declaration.get("parametersJsonSchema")
            if schema is None:
                schema = lower_types(declaration.get("parameters") or {"type": "object", "properties": {}})
            function = {
                "name": declaration["name"],
                "description": declaration.get("description") or "",
                "parameters": schema,
            }
            tools.append({"type": "function", "function": function})
    return tools or None, other


def lower_types(schema: Any) -> Any:
    """A Gemini schema with its type names in JSON Schema's lower case, everything else as sent."""
    if isinstance(schema, list):
        return [lower_types(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key == "type" and isinstance(value, str):
            out[key] = value.lower()
        elif key == "properties" and isinstance(value, dict):
            out[key] = {name: lower_types(sub) for name, sub in value.items()}
        else:
            out[key] = lower_types(value) if key in ("items", "anyOf") else value
    return out


def max_tokens(body: dict) -> int | None:
    return (body.get("generationConfig") or {}).get("maxOutputTokens")


def count_body(body: dict) -> dict:
    """The request countTokens counts (its own fields, or the `generateContentRequest` it wraps)."""
    return body["generateContentRequest"] if isinstance(body.get("generateContentRequest"), dict) else body


# -- replies ------------------------------------------------------------------------------------------
def reply_parts(message: dict) -> list[dict]:
    """Parts for a served chat-form message (`openai_chat.reply_message`, arguments as JSON text)."""
    parts: list[dict] = []
    if message.get("reasoning_content"):
        parts.append({"text": message["reasoning_content"], "thought": True})
    if message.get("content") or not message.get("tool_calls"):
        parts.append({"text": message.get("content") or ""})
    for call in message.get("tool_calls") or ():
        function = call["function"]
        parts.append(
            {"functionCall": {"id": call["id"], "name": function["name"], "args": json.loads(function["arguments"])}}
        )
    return parts


def response_message(message: dict) -> dict:
    """The served reply as a trace-schema `response`: arguments as the objects sent."""
    return _assistant_message(reply_parts(message))


def reply_body(response_id: str, model: str, parts: list[dict], finish: str, usage: tuple[int, int]) -> dict:
    prompt, generated = usage
    candidate = {
        "content": {"role": "model", "parts": parts},
        "finishReason": "MAX_TOKENS" if finish == "length" else "STOP",
        "index": 0,
    }
    return {
        "candidates": [candidate],
        "usageMetadata": {
            "promptTokenCount": prompt,
            "candidatesTokenCount": generated,
            "totalTokenCount": prompt + generated,
        },
        "modelVersion": model,
        "responseId": response_id,
    }


def stream_chunks(reply: dict) -> list[dict]:
    """The reply as streamed chunks: one per part; the last also carries finishReason and usage."""
    candidate = reply["candidates"][0]
    head = {"modelVersion": reply["modelVersion"], "responseId": reply["responseId"]}
    chunks = []
    for part in candidate["content"]["parts"]:
        chunks.append({"candidates": [{"content": {"role": "model", "parts": [part]}, "index": 0}], **head})
    chunks[-1]["candidates"][0]["finishReason"] = candidate["finishReason"]
    chunks[-1]["usageMetadata"] = reply["usageMetadata"]
    return chunks


def sse_frame(chunk: dict) -> bytes:
    return f"data: {json.dumps(chunk, ensure_ascii=False)}\r\n\r\n".encode()
