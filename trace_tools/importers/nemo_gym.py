"""NeMo Gym rollouts (`rollouts.jsonl`) with token ids (docs/importers.md#formats).

Follows NVIDIA-NeMo/Gym `07d6b0d` (`nemo_gym/openai_utils.py`, `nemo_gym/responses_converter.py`).
One line is one rollout, hence one session: the verify response of a resources server,

    {"responses_create_params": {"input": text | [item, ...], "instructions"?, "tools"?, "metadata"?},
     "response": {"id", "output": [item, ...], ...}, "reward", "_ng_task_index", "_ng_rollout_index", ...}

in OpenAI's Responses shape. `response.output` holds every item of the rollout after the input:
per model call its `reasoning` item (summary texts), assistant `message` (output_text parts) and
`function_call`s, the **last** of which carries the call's `prompt_token_ids`,
`generation_token_ids` and `generation_log_probs` (Gym's `return_token_id_information`); between
calls, the `function_call_output`s and any `message` of another role the agent added. Each item
that carries ids closes a model call, hence a turn: its `messages` are the chat so far (the
input, then every earlier item), its reply the assistant message its items make
(`reasoning_content` from the summaries, `content` from the text, `tool_calls` from the function
calls). Chat messages are rebuilt the way Gym converts them back to chat completions.

The session is `<_ng_task_index>:<_ng_rollout_index>` (Gym's rollout id), or the field
`--session-key` names. The rollout's `reward` goes on its last turn; `step` and `weight_version`
on every turn, from `responses_create_params.metadata` (where a trainer may put them; Gym sets
neither). A rollout with no item carrying ids was recorded without `return_token_id_information`
and is malformed (`missing_field`).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from trace_tools.data import Turn
from trace_tools.importers.base import (
    BadRecord,
    Options,
    Outcome,
    logprobs,
    make_turn,
    need,
    optional,
    session_of,
    step_fields,
    token_ids,
)

TOKEN_FIELDS = ("prompt_token_ids", "generation_token_ids", "generation_log_probs")


def outcomes(value: dict, where: str, options: Options) -> Iterator[Outcome]:
    session_id = _session(value, options.session_key)
    if session_id is None:
        looked = repr(options.session_key) if options.session_key else "_ng_task_index and _ng_rollout_index"
        yield Outcome(
            None, where, reason="no_session", detail=f"rollout names no session ({looked}); pass --session-key"
        )
        return
    try:
        params = need(value, "responses_create_params", dict)
        output = need(need(value, "response", dict), "output", list, "response")
        tools = _tools(params.get("tools"))
        facts = step_fields(params.get("metadata"))
        reward = optional(value, "reward", (int, float))
        lead, calls = _calls(output)
        history = _input(params) + [_chat_item(item) for item in lead]
    except BadRecord as bad:
        yield Outcome(session_id, where, reason=bad.reason, detail=bad.detail)
        return
    for number, (items, added) in enumerate(calls):
        here = f"{where} call {number}"
        try:
            turn = _turn(items, list(history), session_id, tools, facts, here, options)
            if number == len(calls) - 1 and reward is not None:
                turn.reward = float(reward)
            yield Outcome(session_id, here, turn=turn)
            history.append(turn.response or {})
            history.extend(_chat_item(item) for item in added)
        except BadRecord as bad:  # the chat after a bad call is unknown: the rest of the rollout is one record
            yield Outcome(session_id, here, reason=bad.reason, detail=bad.detail)
            return


def _session(rollout: dict, key: str | None) -> str | None:
    if key is not None:
        return session_of(rollout, key, ())
    task, attempt = rollout.get("_ng_task_index"), rollout.get("_ng_rollout_index")
    return None if task is None or attempt is None else f"{task}:{attempt}"


def _calls(output: list) -> tuple[list[dict], list[tuple[list[dict], list[dict]]]]:
    """(the items before the first model call, then per call: its items and the items that follow it).

    A call's items end with the one carrying `generation_token_ids`; model items that no such item
    closes were generated without token ids, and the rollout cannot be imported faithfully."""
    lead: list[dict] = []
    calls: list[tuple[list[dict], list[dict]]] = []
    pending: list[dict] = []
    for position, item in enumerate(output):
        if not isinstance(item, dict):
            raise BadRecord("wrong_type", f"response.output[{position}] is a {type(item).__name__}, not an item")
        if _is_model_item(item):
            pending.append(item)
            if item.get("generation_token_ids") is not None:
                calls, pending = [*calls, (pending, [])], []
        elif pending:
            break
        else:
            (calls[-1][1] if calls else lead).append(item)
    if pending or not calls:
        which = "a model call's output items carry no" if calls else "no output item carries"
        raise BadRecord(
            "missing_field",
            f"{which} generation_token_ids: the rollout was recorded without token ids "
            "(set return_token_id_information on the model server)",
        )
    return lead, calls


def _is_model_item(item: dict) -> bool:
    kind = item.get("type")
    return kind in ("reasoning", "function_call") or (kind == "message" and item.get("role") == "assistant")


def _turn(
    items: list[dict], history: list[dict], session_id: str, tools: Any, facts: dict, where: str, options: Options
) -> Turn:
    if not history:
        raise BadRecord("empty_messages", "responses_create_params.input is empty")
    closing = items[-1]
    ids = token_ids(closing["generation_token_ids"], "generation_token_ids", options.vocab_size)
    missing = [name for name in TOKEN_FIELDS if closing.get(name) is None]
    if missing:
        raise BadRecord("missing_field", f"{', '.join(missing)} missing next to generation_token_ids")
    return make_turn(
        session_id,
        messages=history,
        output_ids=ids,
        output_logprobs=logprobs(closing["generation_log_probs"], "generation_log_probs", len(ids)),
        prompt_ids=token_ids(closing["prompt_token_ids"], "prompt_token_ids", options.vocab_size),
        tools=tools,
        response=_reply([item for item in items if _is_model_item(item)]),
        metadata={"import": {"format": options.format, "source": where}},
        **facts,
    )


def _reply(items: list[dict]) -> dict:
    reasoning = [
        _text(item.get("summary") or [], "reasoning summary") for item in items if item.get("type") == "reasoning"
    ]
    text = [_text(item.get("content"), "output message content") for item in items if item.get("type") == "message"]
    reply: dict[str, Any] = {"role": "assistant", "content": "".join(text)}
    if reasoning:
        reply["reasoning_content"] = "\n".join(reasoning)
    calls = [item for item in items if item.get("type") == "function_call"]
    if calls:
        reply["tool_calls"] = [
            {
                "id": need(call, "call_id", str, "function_call"),
                "type": "function",
                "function": {
                    "name": need(call, "name", str, "function_call"),
                    "arguments": need(call, "arguments", str, "function_call"),
                },
            }
            for call in calls
        ]
    return reply


def _input(params: dict) -> list[dict]:
    """The chat the rollout starts from: `instructions` as a system message, then `input`."""
    messages = []
    instructions = optional(params, "instructions", str, "responses_create_params")
    if instructions:
        messages.append({"role": "system", "content": instructions})
    given = params.get("input")
    if isinstance(given, str):
        messages.append({"role": "user", "content": given})
    elif isinstance(given, list):
        messages.extend(_chat_item(item) for item in given)
    elif given is not None:
        raise BadRecord("wrong_type", f"responses_create_params.input is a {type(given).__name__}")
    return messages


def _chat_item(item: Any) -> dict:
    """One non-generated Responses item as a chat message."""
    if not isinstance(item, dict):
        raise BadRecord("wrong_type", "an input item is not an object")
    kind = item.get("type", "message")
    if kind == "function_call_output":
        output = item.get("output")
        text = output if isinstance(output, str) else _text(output, "function_call_output.output")
        return {"role": "tool", "tool_call_id": need(item, "call_id", str, "function_call_output"), "content": text}
    if kind == "message" and isinstance(item.get("role"), str):
        content = item.get("content")
        return {"role": item["role"], "content": content if isinstance(content, str) else _text(content, "content")}
    if _is_model_item(item):  # an earlier assistant turn given in the input
        return _reply([item])
    raise BadRecord("wrong_type", f"input item of type {kind!r} cannot be a chat message")


def _text(parts: Any, label: str) -> str:
    """The text of a list of Responses content parts (`output_text`, `input_text`)."""
    if not isinstance(parts, list) or any(not isinstance(p, dict) for p in parts):
        raise BadRecord("wrong_type", f"{label} is not a list of content parts")
    return "".join(str(p.get("text", "")) for p in parts)


def _tools(tools: Any) -> list[dict] | None:
    """Responses function tools (`{type, name, description, parameters}`) as chat-completion tools."""
    if not tools:
        return None
    if not isinstance(tools, list) or any(not isinstance(t, dict) for t in tools):
        raise BadRecord("wrong_type", "responses_create_params.tools is not an array of tool objects")
    converted = []
    for tool in tools:
        function = {k: tool[k] for k in ("name", "description", "parameters") if k in tool}
        if "strict" in tool and tool["strict"] is not None:
            function["strict"] = tool["strict"]
        converted.append({"type": "function", "function": function})
    return converted
