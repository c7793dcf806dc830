"""How each template family's model writes a turn, and what the gateway returns for it.

The writers reproduce, byte for byte, what the family's chat template renders for the parsed
assistant message, so a byte-exact echo re-renders to exactly the served tokens and every drift
in a simulated dump comes from a behaviour or from a real template effect:

* `qwen3` (TRL `qwen3.jinja`): the generation prompt ends with `assistant\\n`; the model writes
  `<think>\\n{reasoning}\\n</think>\\n\\n{content}`, then each call as
  `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>` (`json.dumps` default separators,
  the model's key order, `\\n` before the first call when there is content and between calls).
* `qwen3.5` (TRL `qwen3_5_think.jinja`): the generation prompt already opened `<think>\\n`, so the
  output starts with the reasoning, then `\\n</think>\\n\\n{content}`, `\\n\\n` before the first
  call when there is content, and XML calls `<tool_call>\\n<function=NAME>\\n<parameter=P>\\nVALUE
  \\n</parameter>\\n</function>\\n</tool_call>` joined by `\\n`. Values are written the way the
  template prints them: strings verbatim, objects and arrays as JSON, other scalars with Jinja's
  `string` filter (Python `str`, so booleans read `True`/`False`).

Both end with `<|im_end|>`. Content and reasoning never start or end with whitespace (the
templates strip it, so a model that emitted it could not be reproduced by any echo).
"""
from __future__ import annotations

import json
import random
import string
from dataclasses import dataclass
from typing import Any, Callable

from trace_tools.simulate.episode import Step
from trace_tools.simulate.tools import tool_position

STOP = "<|im_end|>"
_ID_ALPHABET = string.ascii_letters + string.digits


@dataclass(frozen=True)
class Family:
    """A template family: tokenizer name, template spec, and the writer for its tool-call format."""

    name: str
    tokenizer: str
    template: str
    reasoning_open: bool
    write_calls: Callable[[str, list[str]], str]

    def output_text(self, step: Step) -> str:
        """The text the model generates for `step`, stop token included."""
        calls = [self._call(c.name, c.arguments) for c in step.calls]
        body = self.write_calls(step.content, calls) if calls else step.content
        opening = "" if self.reasoning_open else "<think>\n"
        return f"{opening}{step.reasoning}\n</think>\n\n{body}{STOP}"

    def _call(self, name: str, arguments: dict[str, Any]) -> str:
        if self.name == "qwen3":
            return '<tool_call>\n{"name": "' + name + '", "arguments": ' + json.dumps(arguments, ensure_ascii=False) + "}\n</tool_call>"
        parameters = "".join(f"<parameter={key}>\n{xml_value(value)}\n</parameter>\n" for key, value in arguments.items())
        return f"<tool_call>\n<function={name}>\n{parameters}</function>\n</tool_call>"


def _json_calls(content: str, calls: list[str]) -> str:
    return (content + "\n" if content else "") + "\n".join(calls)


def _xml_calls(content: str, calls: list[str]) -> str:
    return (content + "\n\n" if content else "") + "\n".join(calls)


def xml_value(value: Any) -> str:
    """A parameter value as `qwen3_5_think.jinja` prints it."""
    if isinstance(value, (dict, list)):
        return json.dumps(value, ensure_ascii=False)
    return str(value)


FAMILIES = {
    "qwen3": Family("qwen3", "qwen3", "qwen3", False, _json_calls),
    "qwen3.5": Family("qwen3.5", "qwen3.5", "qwen3.5", True, _xml_calls),
}


def call_id(rng: random.Random) -> str:
    """An OpenAI-style tool-call id."""
    return "call_" + "".join(rng.choice(_ID_ALPHABET) for _ in range(24))


def response_message(step: Step, tools: list[dict], rng: random.Random) -> dict[str, Any]:
    """The assistant message the gateway returns for a completed `step` (OpenAI wire form).

    Arguments are a JSON string in the model's key order; each call carries an `id` and, as
    SGLang does, an `index` that is the tool's position in the request's tool list.
    """
    message: dict[str, Any] = {"role": "assistant", "content": step.content}
    if step.reasoning:
        message["reasoning_content"] = step.reasoning
    if step.calls:
        message["tool_calls"] = [
            {"id": call_id(rng), "index": tool_position(tools, c.name), "type": "function",
             "function": {"name": c.name, "arguments": json.dumps(c.arguments, ensure_ascii=False)}}
            for c in step.calls]
    return message


def wire_from_parsed(parsed: dict[str, Any], tools: list[dict], rng: random.Random) -> dict[str, Any]:
    """A parsed message (arguments as dicts) in wire form; used for replies only a parser can read."""
    message: dict[str, Any] = {"role": "assistant", "content": parsed.get("content") or ""}
    if parsed.get("reasoning_content"):
        message["reasoning_content"] = parsed["reasoning_content"]
    calls = parsed.get("tool_calls") or []
    if calls:
        message["tool_calls"] = [
            {"id": call_id(rng), "index": tool_position(tools, c["function"]["name"]), "type": "function",
             "function": {"name": c["function"]["name"],
                          "arguments": json.dumps(c["function"]["arguments"], ensure_ascii=False)}}
            for c in calls]
    return message
