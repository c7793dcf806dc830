"""A toy chat template and character-level tokenizer for the chains tests (no tests here).

Layout of one message: `<|s|>` ROLE "\\n" BODY `<|e|>` SEP, where SEP defaults to "\\n"; the
generation prompt is `<|s|>assistant\\n`. Tool schemas open the text as `<|tools|>` JSON `<|e|>`
SEP. An assistant body is its content followed by one `<|call|>` JSON `<|/call|>` per tool call.
Special markers are single tokens 1..5 (`<|e|>` = 2 is the EOS); every other character is one
token, 1000 + its code point. So `tok(text)` spells expected ids in readable text.
"""

from __future__ import annotations

import json
import re

from trace_tools.errors import ReplayError
from trace_tools.render.base import ParsedResponse

SPECIAL = {"<|s|>": 1, "<|e|>": 2, "<|tools|>": 3, "<|call|>": 4, "<|/call|>": 5}
EOS = SPECIAL["<|e|>"]
CHAR_BASE = 1000
_SPLIT = re.compile("(" + "|".join(re.escape(s) for s in SPECIAL) + ")")
_BY_ID = {v: k for k, v in SPECIAL.items()}


def tok(text: str) -> list[int]:
    ids: list[int] = []
    for piece in _SPLIT.split(text):
        if piece in SPECIAL:
            ids.append(SPECIAL[piece])
        else:
            ids.extend(CHAR_BASE + ord(c) for c in piece)
    return ids


def untok(ids) -> str:
    return "".join(_BY_ID.get(i) or chr(i - CHAR_BASE) for i in ids)


def gen(text: str) -> list[int]:
    """What the toy model emits for an assistant reply: the text, then the EOS marker."""
    return tok(text) + [EOS]


class ToyRenderer:
    """RendererLike over the toy template.

    Variants: `separator` (what follows every message), `require_user` (refuse a conversation
    without a user message, like Qwen3.5), `reject_string_content` (refuse non-empty string
    content, accepting only lists of text parts).
    """

    vocab_size = CHAR_BASE + 0x110000
    stop_token_ids = [EOS]

    def __init__(self, separator: str = "\n", require_user: bool = False, reject_string_content: bool = False):
        self.separator = separator
        self.require_user = require_user
        self.reject_string_content = reject_string_content
        self.render_calls = 0

    def render_text(self, messages, tools=None, add_generation_prompt=True, **kwargs) -> str:
        self.render_calls += 1
        if self.require_user and not any(m["role"] == "user" for m in messages):
            raise ReplayError("toy template: no user message")
        parts = [f"<|tools|>{json.dumps(tools, sort_keys=True)}<|e|>{self.separator}"] if tools else []
        for message in messages:
            parts.append(f"<|s|>{message['role']}\n{self._body(message)}<|e|>{self.separator}")
        if add_generation_prompt:
            parts.append("<|s|>assistant\n")
        return "".join(parts)

    def render(self, messages, tools=None, add_generation_prompt=True, **kwargs) -> list[int]:
        return self.encode(self.render_text(messages, tools, add_generation_prompt, **kwargs))

    def encode(self, text: str) -> list[int]:
        return tok(text)

    def decode(self, ids) -> str:
        return untok(ids)

    def parse_response(self, output_ids, tools=None) -> ParsedResponse:
        text = untok(output_ids).removesuffix("<|e|>")
        content, *calls = text.split("<|call|>")
        tool_calls = [{"type": "function", "function": json.loads(call.removesuffix("<|/call|>"))} for call in calls]
        message = {"role": "assistant", "content": content}
        if tool_calls:
            message["tool_calls"] = tool_calls
        return ParsedResponse(message)

    def _body(self, message: dict) -> str:
        content = message.get("content")
        if isinstance(content, list):
            content = "".join(part.get("text", "") for part in content)
        elif self.reject_string_content and content:
            raise ReplayError("toy template: text must come as a list of parts")
        body = content or ""
        for call in message.get("tool_calls") or []:
            function = call["function"]
            body += (
                "<|call|>"
                + json.dumps({"name": function["name"], "arguments": function["arguments"]}, sort_keys=True)
                + "<|/call|>"
            )
        return body


def system(text: str) -> dict:
    return {"role": "system", "content": text}


def user(text: str) -> dict:
    return {"role": "user", "content": text}


def assistant(text: str, calls: list[dict] | None = None) -> dict:
    message = {"role": "assistant", "content": text}
    if calls:
        message["tool_calls"] = calls
    return message


def call(call_id: str, name: str, arguments) -> dict:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def tool_result(call_id: str, text: str) -> dict:
    return {"role": "tool", "tool_call_id": call_id, "content": text}
