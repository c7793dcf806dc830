"""A small chat-template stand-in and a scripted harness for the checkpoint-tree tests.

Rendering: every message is `OPEN role ":" body CLOSE "\\n"` (OPEN and CLOSE are single
characters that encode to the special ids 1 and 2), the generation prompt is `OPEN "assistant:"`,
tools (if any) come first as one header message. An assistant body is `[r]reasoning[/r]` (when
there is reasoning), the content, then ` >name{json args}` per tool call with the arguments in
their own key order, as order-sensitive real templates print them. `rewrite_history=True` drops
the reasoning of assistants that precede the last user message (the Qwen behaviour that breaks
prefix consistency). `tool_closer` changes the glue after a tool-calling assistant (a template
whose closer depends on the message type), `leading_newline` starts every message with "\\n",
`refuse_tool_calls` raises TypeError on an assistant with tool calls (as a Jinja filter does when
a template meets arguments of a type it cannot iterate).

Encoding is one id per character (100 + code point) except the specials and the pair "\\n\\n",
which encodes as the single id 3 (the merge that makes boundaries matter). Served output ids in
the tests are 50000 and above: no render ever produces them, so a prompt that contains them
reused the served ids, and one that does not re-rendered history.
"""

from __future__ import annotations

import copy
import json
from typing import Any

from trace_tools.data import Session, Turn

OPEN, CLOSE = "\x01", "\x02"
OPEN_ID, CLOSE_ID, NN_ID = 1, 2, 3
SERVED = 50000


class ToyTemplate:
    """RendererLike over the toy format described in the module docstring."""

    vocab_size = 200000

    def __init__(
        self,
        *,
        rewrite_history: bool = False,
        tool_closer: str | None = None,
        leading_newline: bool = False,
        refuse_tool_calls: bool = False,
    ):
        self.rewrite_history = rewrite_history
        self.refuse_tool_calls = refuse_tool_calls
        self.tool_closer = tool_closer
        self.leading_newline = leading_newline
        self.texts_rendered = 0

    def render_text(self, messages, tools=None, add_generation_prompt=True, **kwargs) -> str:
        self.texts_rendered += 1
        last_user = max((i for i, m in enumerate(messages) if m["role"] == "user"), default=-1)
        parts = [self._wrap("tools", json.dumps(tools))] if tools else []
        for index, message in enumerate(messages):
            keep_reasoning = not (self.rewrite_history and index < last_user)
            parts.append(self._message(message, keep_reasoning))
        if add_generation_prompt:
            parts.append(OPEN + "assistant:")
        return "".join(parts)

    def render(self, messages, tools=None, add_generation_prompt=True, **kwargs) -> list[int]:
        return self.encode(self.render_text(messages, tools, add_generation_prompt, **kwargs))

    def _message(self, message: dict, keep_reasoning: bool) -> str:
        if message["role"] != "assistant":
            return self._wrap(message["role"], message.get("content") or "")
        if self.refuse_tool_calls and message.get("tool_calls"):
            raise TypeError("cannot render these tool calls")
        body = ""
        if keep_reasoning and message.get("reasoning_content"):
            body += "[r]" + message["reasoning_content"] + "[/r]"
        body += message.get("content") or ""
        for call in message.get("tool_calls") or []:
            body += " >" + call["function"]["name"] + json.dumps(call["function"]["arguments"])
        closer = "\n" if not (message.get("tool_calls") and self.tool_closer) else self.tool_closer
        return self._wrap("assistant", body, closer)

    def _wrap(self, role: str, body: str, closer: str = "\n") -> str:
        return ("\n" if self.leading_newline else "") + OPEN + role + ":" + body + CLOSE + closer

    def encode(self, text: str) -> list[int]:
        ids, i = [], 0
        while i < len(text):
            if text.startswith("\n\n", i):
                ids.append(NN_ID)
                i += 2
                continue
            ids.append({OPEN: OPEN_ID, CLOSE: CLOSE_ID}.get(text[i], 100 + ord(text[i])))
            i += 1
        return ids

    def decode(self, ids) -> str:
        table = {OPEN_ID: OPEN, CLOSE_ID: CLOSE, NN_ID: "\n\n"}
        return "".join(table.get(i, chr(i - 100) if 100 <= i < SERVED else "?") for i in ids)

    def parse_response(self, output_ids, tools=None):  # the tests always record a response
        raise NotImplementedError


# -- messages ---------------------------------------------------------------------------------
def system(text: str = "You fix bugs in the kettle firmware.") -> dict:
    return {"role": "system", "content": text}


def user(text: str) -> dict:
    return {"role": "user", "content": text}


def tool(text: str, call_id: str | None = None) -> dict:
    message = {"role": "tool", "content": text}
    if call_id is not None:
        message["tool_call_id"] = call_id
    return message


def reply(content: str = "", *calls: tuple[str, dict], reasoning: str | None = None) -> dict:
    """A recorded response in wire form (arguments as JSON strings, ids and index as SGLang sends)."""
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if reasoning:
        message["reasoning_content"] = reasoning
    if calls:
        message["tool_calls"] = [
            {
                "id": f"call_{name.lower()}_{n}",
                "index": n,
                "type": "function",
                "function": {"name": name, "arguments": json.dumps(args)},
            }
            for n, (name, args) in enumerate(calls)
        ]
    return message


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "Patch",
            "parameters": {
                "type": "object",
                "properties": {
                    "path": {"type": "string"},
                    "find": {"type": "string"},
                    "put": {"type": "string"},
                    "everywhere": {"type": "boolean", "default": False},
                },
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "Shell",
            "parameters": {
                "type": "object",
                "properties": {"cmd": {"type": "string"}, "wait_s": {"type": "integer", "default": 30}},
            },
        },
    },
]
SUB_TOOLS = [TOOLS[1]]


class Harness:
    """Scripts one session: each `call` records a turn; `echo` says how replies come back.

    `served` hands out output ids no render can produce (SERVED upwards), ending in CLOSE_ID
    unless the turn was cut at the length limit.
    """

    def __init__(self, session_id: str = "toy-session", echo=None):
        self.session_id, self.echo = session_id, echo or (lambda message: copy.deepcopy(message))
        self.turns: list[Turn] = []
        self._next_id = SERVED

    def call(
        self,
        messages: list[dict],
        response: dict,
        *,
        tools=TOOLS,
        length: int = 4,
        finish: str = "stop",
        prompt_ids=None,
        kwargs=None,
    ) -> int:
        """Record one generation on `messages`; returns its turn index."""
        output = list(range(self._next_id, self._next_id + length))
        self._next_id += length
        if finish != "length":
            output.append(CLOSE_ID)
        index = len(self.turns)
        logprobs = [-0.01 * (index + 1) - 0.001 * k for k in range(len(output))]
        self.turns.append(
            Turn(
                self.session_id,
                index,
                copy.deepcopy(messages),
                output,
                tools=tools,
                output_logprobs=logprobs,
                prompt_ids=prompt_ids,
                response=copy.deepcopy(response),
                finish_reason=finish,
                chat_template_kwargs=kwargs,
            )
        )
        return index

    def replay(self, history: list[dict], response: dict) -> None:
        """Append the harness's echo of `response` to its history."""
        history.append(self.echo(response))

    def session(self) -> Session:
        return Session(self.session_id, list(self.turns))
