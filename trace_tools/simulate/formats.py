"""How each template family's model writes a turn, and what the gateway returns for it.

The writers reproduce, byte for byte, what the family's chat template renders for the parsed
assistant message wherever the template can render it, so a byte-exact echo re-renders to exactly
the served tokens and every drift in a simulated dump comes from a behaviour or from a real
template effect:

* `qwen3` (TRL `qwen3.jinja`): the generation prompt ends with `assistant\n`; the model writes
  `<think>\n{reasoning}\n</think>\n\n{content}`, then each call as
  `<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>` (`json.dumps` default separators,
  the model's key order, `\n` before the first call when there is content and between calls).
* `qwen3.5` (TRL `qwen3_5_think.jinja`): the generation prompt already opened `<think>\n`, so the
  output starts with the reasoning, then `\n</think>\n\n{content}`, `\n\n` before the first
  call when there is content, and XML calls `<tool_call>\n<function=NAME>\n<parameter=P>\nVALUE
  \n</parameter>\n</function>\n</tool_call>` joined by `\n`. Values are written the way the
  template prints them: strings verbatim, objects and arrays as JSON, other scalars with Jinja's
  `string` filter (Python `str`, so booleans read `True`/`False`).
  Both Qwen families end with `<|im_end|>`.
* `glm4.5` (TRL `glm4moe.jinja`): `\n<think>{reasoning}</think>`, `\n{content}`, then per call
  `\n<tool_call>NAME\n` + `<arg_key>K</arg_key>\n<arg_value>V</arg_value>\n` per argument +
  `</tool_call>` (strings verbatim, anything else as JSON); the model stops on `<|observation|>`
  after calls and on `<|user|>` after an answer: the tokens that open the next message.
* `deepseek-v3` (TRL `deepseekv3.jinja`): after a user turn the generation prompt opens `<think>\n`,
  so the output starts with `{reasoning}\n</think>\n\n`; after tool outputs there is no opener and
  the model answers directly. Then `{content}` and the calls
  `<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\n```json\n{ARGS}\n```<｜tool▁call▁end｜>`
  (joined by `\n`) `<｜tool▁calls▁end｜>`, and `<｜end▁of▁sentence｜>`. The template never renders
  reasoning and renders later tool-call turns without their content, so history re-renders
  differ from the served tokens on every reasoning turn: a real template effect.
* `gpt-oss` (TRL `gptoss.jinja`, harmony): `<|channel|>analysis<|message|>{reasoning}<|end|>`, then
  `<|start|>assistant to=functions.NAME<|channel|>commentary json<|message|>{ARGS}<|call|>` (the
  recipient where the template puts it) or `<|start|>assistant<|channel|>final<|message|>{content}
  <|return|>`. One call per turn (`<|call|>` is a stop token), and a call turn carries no content
  (the template renders a call turn's content as its analysis and refuses both at once).
* `llama3.1` (TRL `llama3_1.jinja`): one call per turn as `{"name": NAME, "parameters": {ARGS}}`
  with no text (the template allows one call and drops content next to it), or the answer text;
  no reasoning; `<|eot_id|>`.

A step with several calls becomes consecutive single-call turns for the one-call families
(`Family.turn_steps`). Content and reasoning never start or end with whitespace (the templates
strip it, so a model that emitted it could not be reproduced by any echo).
"""

from __future__ import annotations

import json
import random
import string
from dataclasses import dataclass, replace
from typing import Any, Callable

from trace_tools import families as records
from trace_tools.simulate.episode import Call, Step
from trace_tools.simulate.tools import tool_position

THINK_OPENER = "<think>\n"
_ID_ALPHABET = string.ascii_letters + string.digits
Writer = Callable[[Step, bool], str]
# family name (a record's `name`) -> how its model writes a turn
WRITERS: dict[str, Writer] = {}


def _writes(family: str) -> Callable[[Writer], Writer]:
    """Register the decorated function as the writer of `family`."""

    def register(write: Writer) -> Writer:
        WRITERS[family] = write
        return write

    return register


@dataclass(frozen=True)
class Family:
    """A template family: tokenizer name, template spec, and how its model writes a turn.

    `write(step, opened)` gives the output text (stop token included) of an emitted step;
    `opened` says whether the prompt ended by opening the reasoning (`<think>\n`). The other
    fields come from the family's record (`trace_tools.families.ModelFamily`, which says what
    they mean).
    """

    name: str
    tokenizer: str
    template: str
    write: Writer
    one_call_per_turn: bool = False
    reasoning: str = "always"  # "always", "when_opened" (DeepSeek) or "never" (Llama)
    content_with_calls: bool = True
    call_opener: str | None = "<tool_call>"  # the token a truncated call starts after

    def emitted(self, step: Step, prompt_text: str) -> tuple[Step, str]:
        """(the step as this family's model emits it after a prompt ending in `prompt_text`, its text)."""
        opened = prompt_text.endswith(THINK_OPENER)
        if self.reasoning == "never" or (self.reasoning == "when_opened" and not opened):
            step = replace(step, reasoning="")
        if step.calls and not self.content_with_calls:
            step = replace(step, content="")
        return step, self.write(step, opened)

    def turn_steps(self, steps: list[Step]) -> list[Step]:
        """The planned steps as this family's model takes them: one call per turn where it must."""
        out = []
        for step in steps:
            step = replace(step, subagent=self.turn_steps(step.subagent)) if step.subagent else step
            if not self.one_call_per_turn or len(step.calls) <= 1:
                out.append(step)
                continue
            out.append(replace(step, calls=step.calls[:1], results=step.results[:1]))
            out += [
                replace(
                    step,
                    reasoning=f"Next, the {call.name} call from the same plan.",
                    content="",
                    calls=[call],
                    results=[result],
                    subagent=[],
                )
                for call, result in zip(step.calls[1:], step.results[1:])
            ]
        return out


@_writes("qwen3")
def _qwen3(step: Step, opened: bool) -> str:
    calls = [
        '<tool_call>\n{"name": "' + c.name + '", "arguments": ' + _json(c.arguments) + "}\n</tool_call>"
        for c in step.calls
    ]
    body = (step.content + "\n" if step.content and calls else step.content) + "\n".join(calls)
    return f"{'' if opened else THINK_OPENER}{step.reasoning}\n</think>\n\n{body}<|im_end|>"


@_writes("qwen3.5")
def _qwen35(step: Step, opened: bool) -> str:
    calls = [_xml_call(c) for c in step.calls]
    body = (step.content + "\n\n" if step.content and calls else step.content) + "\n".join(calls)
    return f"{'' if opened else THINK_OPENER}{step.reasoning}\n</think>\n\n{body}<|im_end|>"


def _xml_call(call: Call) -> str:
    parameters = "".join(
        f"<parameter={key}>\n{xml_value(value)}\n</parameter>\n" for key, value in call.arguments.items()
    )
    return f"<tool_call>\n<function={call.name}>\n{parameters}</function>\n</tool_call>"


def xml_value(value: Any) -> str:
    """A parameter value as `qwen3_5_think.jinja` prints it."""
    if isinstance(value, (dict, list)):
        return _json(value)
    return str(value)


@_writes("glm4.5")
def _glm(step: Step, opened: bool) -> str:
    calls = "".join(
        f"\n<tool_call>{c.name}\n"
        + "".join(
            f"<arg_key>{key}</arg_key>\n<arg_value>{value if isinstance(value, str) else _json(value)}</arg_value>\n"
            for key, value in c.arguments.items()
        )
        + "</tool_call>"
        for c in step.calls
    )
    content = f"\n{step.content}" if step.content else ""
    return f"\n<think>{step.reasoning}</think>{content}{calls}{'<|observation|>' if step.calls else '<|user|>'}"


@_writes("deepseek-v3")
def _deepseek(step: Step, opened: bool) -> str:
    reasoning = f"{step.reasoning}\n</think>\n\n" if opened else ""
    calls = "\n".join(
        f"<｜tool▁call▁begin｜>function<｜tool▁sep｜>{c.name}\n```json\n{_json(c.arguments)}\n```<｜tool▁call▁end｜>"
        for c in step.calls
    )
    section = f"<｜tool▁calls▁begin｜>{calls}<｜tool▁calls▁end｜>" if calls else ""
    return f"{reasoning}{step.content}{section}<｜end▁of▁sentence｜>"


@_writes("gpt-oss")
def _harmony(step: Step, opened: bool) -> str:
    analysis = f"<|channel|>analysis<|message|>{step.reasoning}<|end|><|start|>assistant" if step.reasoning else ""
    if step.calls:
        call = step.calls[0]
        return (
            f"{analysis} to=functions.{call.name}<|channel|>commentary json<|message|>{_json(call.arguments)}<|call|>"
        )
    return f"{analysis}<|channel|>final<|message|>{step.content}<|return|>"


@_writes("llama3.1")
def _llama(step: Step, opened: bool) -> str:
    if step.calls:
        call = step.calls[0]
        return '{"name": "' + call.name + '", "parameters": ' + _json(call.arguments) + "}<|eot_id|>"
    return f"{step.content}<|eot_id|>"


def _json(value: Any) -> str:
    """JSON the way transformers' `tojson` filter and the models write it: default separators."""
    return json.dumps(value, ensure_ascii=False)


# One simulated model per family record, in the records' order.
FAMILIES = {
    record.name: Family(
        record.name,
        record.tokenizer,
        record.name,
        WRITERS[record.name],
        one_call_per_turn=record.one_call_per_turn,
        reasoning=record.reasoning,
        content_with_calls=record.content_with_calls,
        call_opener=record.call_opener,
    )
    for record in records.FAMILIES.values()
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
            {
                "id": call_id(rng),
                "index": tool_position(tools, c.name),
                "type": "function",
                "function": {"name": c.name, "arguments": json.dumps(c.arguments, ensure_ascii=False)},
            }
            for c in step.calls
        ]
    return message


def wire_from_parsed(parsed: dict[str, Any], tools: list[dict], rng: random.Random) -> dict[str, Any]:
    """A parsed message (arguments as dicts) in wire form; used for replies only a parser can read."""
    message: dict[str, Any] = {"role": "assistant", "content": parsed.get("content") or ""}
    if parsed.get("reasoning_content"):
        message["reasoning_content"] = parsed["reasoning_content"]
    calls = parsed.get("tool_calls") or []
    if calls:
        message["tool_calls"] = [
            {
                "id": call_id(rng),
                "index": tool_position(tools, c["function"]["name"]),
                "type": "function",
                "function": {
                    "name": c["function"]["name"],
                    "arguments": json.dumps(c["function"]["arguments"], ensure_ascii=False),
                },
            }
            for c in calls
        ]
    return message
