"""A toy ChatML-like renderer and session builders for the session-v1/v2 tests (no tests here).

Vocabulary: `<|im_start|>` = 1, `<|im_end|>` = 2, every other character is one token with id
100 + code point. A message renders as `<|im_start|>ROLE\\nBODY<|im_end|>\\n`; tools render as a
`tools` block of compact JSON lines; the generation prompt is `<|im_start|>assistant\\n`. An
assistant body is `<think>R</think>` (when it has reasoning), its content, then one
`<call>NAME ARGS</call>` per tool call, ARGS being compact JSON. Content None renders as "None",
the way Jinja prints it.

Switches that reproduce template behaviours the session server meets:
* `reasoning="last_only"` renders reasoning only on the last message (a template that rewrites
  history, so the dummy-base suffix diff fails);
* `require_user=True` raises a jinja TemplateError when no user message is present (like TRL's
  Qwen3.5 think template).
"""

from __future__ import annotations

import json
from typing import Any, Sequence

from trace_tools.data import Session, Turn
from trace_tools.render.base import ParsedResponse

IM_START, IM_END = 1, 2
SPECIALS = {"<|im_start|>": IM_START, "<|im_end|>": IM_END}
CHAR_BASE = 100
NEWLINE = CHAR_BASE + ord("\n")


class ToyRenderer:
    vocab_size = CHAR_BASE + 0x110000

    def __init__(self, family: str = "qwen3", reasoning: str = "always", require_user: bool = False):
        self.family, self.reasoning, self.require_user = family, reasoning, require_user
        self.calls: list[dict[str, Any]] = []  # every render_text call, for assertions

    def encode(self, text: str) -> list[int]:
        ids, i = [], 0
        while i < len(text):
            special = next((s for s in SPECIALS if text.startswith(s, i)), None)
            if special:
                ids.append(SPECIALS[special])
                i += len(special)
            else:
                ids.append(CHAR_BASE + ord(text[i]))
                i += 1
        return ids

    def decode(self, ids: Sequence[int]) -> str:
        names = {v: k for k, v in SPECIALS.items()}
        return "".join(names.get(i) or chr(i - CHAR_BASE) for i in ids)

    def render_text(
        self,
        messages: Sequence[dict],
        tools: Sequence[dict] | None = None,
        add_generation_prompt: bool = True,
        **template_kwargs: Any,
    ) -> str:
        self.calls.append(
            {"messages": list(messages), "tools": tools, "gp": add_generation_prompt, "kwargs": template_kwargs}
        )
        if self.require_user and not any(m.get("role") == "user" for m in messages):
            from jinja2 import TemplateError

            raise TemplateError("No user query found in messages.")
        text = ""
        if tools:
            text += "<|im_start|>tools\n" + "\n".join(compact(t) for t in tools) + "<|im_end|>\n"
        for position, message in enumerate(messages):
            last = position == len(messages) - 1
            text += f"<|im_start|>{message['role']}\n{self.body(message, last)}<|im_end|>\n"
        if add_generation_prompt:
            text += "<|im_start|>assistant\n"
        return text

    def body(self, message: dict, last: bool = True) -> str:
        if message.get("role") != "assistant":
            return str(message.get("content"))
        text = ""
        reasoning = message.get("reasoning_content")
        if reasoning and (self.reasoning == "always" or last):
            text += f"<think>{reasoning}</think>"
        text += str(message.get("content"))
        for call in message.get("tool_calls") or []:
            function = call.get("function", call)
            args = function.get("arguments")
            text += f"<call>{function['name']} {args if isinstance(args, str) else compact(args)}</call>"
        return text

    def render(
        self,
        messages: Sequence[dict],
        tools: Sequence[dict] | None = None,
        add_generation_prompt: bool = True,
        **template_kwargs: Any,
    ) -> list[int]:
        return self.encode(self.render_text(messages, tools, add_generation_prompt, **template_kwargs))

    def parse_response(self, output_ids: Sequence[int], tools: Sequence[dict] | None = None) -> ParsedResponse:
        text = self.decode(output_ids).removesuffix("<|im_end|>")
        return ParsedResponse({"role": "assistant", "content": text})


def compact(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


# -- messages ------------------------------------------------------------------------------------
def user(text: str) -> dict:
    return {"role": "user", "content": text}


def system(text: str) -> dict:
    return {"role": "system", "content": text}


def tool(text: str, call_id: str | None = None) -> dict:
    message = {"role": "tool", "content": text}
    if call_id:
        message["tool_call_id"] = call_id
    return message


def call(name: str, arguments: Any, call_id: str | None = None, index: int | None = None) -> dict:
    entry: dict[str, Any] = {"type": "function", "function": {"name": name, "arguments": arguments}}
    if call_id is not None:
        entry["id"] = call_id
    if index is not None:
        entry["index"] = index
    return entry


def assistant(content: str | None = "", *calls: dict, reasoning: str | None = None) -> dict:
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if reasoning is not None:
        message["reasoning_content"] = reasoning
    if calls:
        message["tool_calls"] = list(calls)
    return message


# -- turns and sessions -----------------------------------------------------------------------------
TOY = ToyRenderer()


def output_for(response: dict, renderer: ToyRenderer = TOY, stop: bool = True) -> list[int]:
    """What a model served for `response`: its rendered body, then the stop token."""
    parsed = json.loads(json.dumps(response))
    for entry in parsed.get("tool_calls") or []:
        if isinstance(entry["function"].get("arguments"), str):
            entry["function"]["arguments"] = json.loads(entry["function"]["arguments"])
    if parsed.get("content") is None:
        parsed["content"] = ""
    return renderer.encode(renderer.body(parsed)) + ([IM_END] if stop else [])


def make_turn(
    index: int,
    messages: list[dict],
    response: dict,
    *,
    tools: list | None = None,
    finish: str | None = "stop",
    prompt_ids: list[int] | None = None,
    output: list[int] | None = None,
    kwargs: dict | None = None,
    reward: float | None = None,
) -> Turn:
    ids = output if output is not None else output_for(response, stop=finish != "length")
    logprobs = [-(index + 1) - k / 1000 for k in range(len(ids))]  # distinct per turn and position
    return Turn(
        session_id="s",
        turn_index=index,
        messages=messages,
        output_ids=ids,
        tools=tools,
        output_logprobs=logprobs,
        prompt_ids=prompt_ids,
        response=response,
        finish_reason=finish,
        chat_template_kwargs=kwargs,
        reward=reward,
    )


def session_of(*turns: Turn) -> Session:
    return Session("s", list(turns))


def conversation(requests: list[tuple[list[dict], dict]], **kw: Any) -> Session:
    """A session from (request messages, response) pairs, turn indices in order."""
    return session_of(*(make_turn(i, msgs, resp, **kw) for i, (msgs, resp) in enumerate(requests)))
