"""Harbor's Agent Trajectory Interchange Format (ATIF) trajectories (docs/importers.md#formats).

Follows the ATIF RFC (harbor `docs/rfcs/0001-trajectory-format.md`) at schema v1.4, the first
version whose steps carry the prompt ids next to the completion ids; later versions read the same
way (`agent.tool_definitions` is read when present; optional fields added since are ignored).
One `trajectory.json` is one trial, hence one session:

    {"schema_version": "ATIF-v1.4", "session_id", "agent": {"name", "version", "model_name",
     "tool_definitions"?, "extra"?}, "steps": [step, ...], "extra"?}

    step: {"step_id", "timestamp"?, "source": "system" | "user" | "agent", "message",
           "reasoning_content"?, "tool_calls"?: [{"tool_call_id", "function_name", "arguments"}],
           "observation"?: {"results": [{"source_call_id"?, "content"?}]},
           "metrics"?: {"prompt_token_ids", "completion_token_ids", "logprobs", ...}, "extra"?}

Every `agent` step is a generation call, hence a turn. The chat so far is rebuilt step by step:
a `system` or `user` step is a message of that role; an agent step's reply is an assistant
message (`message` as content, `reasoning_content`, its `tool_calls` with the arguments written
as JSON text); its observation's results follow as `tool` messages (`source_call_id` as
`tool_call_id`), or as a `user` message for a result that answers no tool call. A turn's
`messages` is the chat before its step. The ids are the step's `metrics.completion_token_ids`
(and `prompt_token_ids`, `logprobs`); a trajectory whose agent steps carry none (recorded
without token ids, e.g. against a hosted API) is malformed, `missing_field`, saying so.

`step` and `weight_version` come from the step's `extra`, else the trajectory's `extra`
(ATIF names neither). Harbor writes the reward in the trial's `result.json`, which is not read:
a directory source contributes only its `trajectory.json` files.
"""

from __future__ import annotations

import json
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
    timestamp,
    token_ids,
)

ROLES = {"system": "system", "user": "user"}  # the non-agent step sources and the message each is


def outcomes(value: dict, where: str, options: Options) -> Iterator[Outcome]:
    session_id = session_of(value, options.session_key, ("session_id", "trajectory_id"))
    if session_id is None:
        yield Outcome(None, where, reason="no_session", detail="trajectory has no session_id; pass --session-key")
        return
    try:
        steps, tools = _steps(value), _tools(value.get("agent"))
    except BadRecord as bad:
        yield Outcome(session_id, where, reason=bad.reason, detail=bad.detail)
        return
    history: list[dict] = []
    for position, step in enumerate(steps):
        here = f"{where} steps[{position}]"
        try:
            if step.get("source") == "agent":
                turn = _turn(step, value, session_id, list(history), tools, here, options)
                yield Outcome(session_id, here, turn=turn)
            history.extend(_messages(step))
        except BadRecord as bad:  # the chat after a bad step is unknown: the rest of the trial is one record
            yield Outcome(session_id, here, reason=bad.reason, detail=bad.detail)
            return


def _steps(trajectory: dict) -> list[dict]:
    version = trajectory.get("schema_version")
    if not isinstance(version, str) or not version.startswith("ATIF-v"):
        raise BadRecord("bad_json", f"schema_version is {version!r}, not an ATIF version (ATIF-v1.4 or later)")
    steps = need(trajectory, "steps", list)
    if any(not isinstance(step, dict) for step in steps):
        raise BadRecord("wrong_type", "steps holds an entry that is not a step object")
    agent_steps = [step for step in steps if step.get("source") == "agent"]
    if not agent_steps:
        raise BadRecord("missing_field", "trajectory has no agent step, so no generation call to import")
    if not any(
        isinstance(step.get("metrics"), dict) and "completion_token_ids" in step["metrics"] for step in agent_steps
    ):
        raise BadRecord(
            "missing_field",
            f"trajectory recorded without token ids ({version}: no agent step has metrics.completion_token_ids); "
            "record it with token ids (ATIF v1.4+, an engine that returns them)",
        )
    return steps


def _tools(agent: Any) -> list[dict] | None:
    """`agent.tool_definitions` (OpenAI function-calling tools), kept as written."""
    definitions = agent.get("tool_definitions") if isinstance(agent, dict) else None
    if definitions is None:
        return None
    if not isinstance(definitions, list) or any(not isinstance(d, dict) for d in definitions):
        raise BadRecord("wrong_type", "agent.tool_definitions is not an array of tool objects")
    return definitions


def _turn(
    step: dict, trajectory: dict, session_id: str, history: list[dict], tools: Any, where: str, options: Options
) -> Turn:
    metrics = need(step, "metrics", dict, "step")
    label = f"step {step.get('step_id')} metrics"
    if metrics.get("completion_token_ids") is None:
        raise BadRecord("missing_field", f"{label}.completion_token_ids is missing (recorded without token ids)")
    output_ids = token_ids(metrics["completion_token_ids"], f"{label}.completion_token_ids", options.vocab_size)
    values = metrics.get("logprobs")
    prompt = metrics.get("prompt_token_ids")
    if not history:
        raise BadRecord("empty_messages", f"step {step.get('step_id')} is an agent step with no message before it")
    agent: dict = trajectory["agent"] if isinstance(trajectory.get("agent"), dict) else {}
    return make_turn(
        session_id,
        messages=history,
        output_ids=output_ids,
        output_logprobs=None if values is None else logprobs(values, f"{label}.logprobs", len(output_ids)),
        prompt_ids=None if prompt is None else token_ids(prompt, f"{label}.prompt_token_ids", options.vocab_size),
        tools=tools,
        response=_reply(step),
        started_at=timestamp(step.get("timestamp"), "timestamp"),
        metadata={
            "import": {"format": options.format, "source": where},
            "atif": {
                "step_id": step.get("step_id"),
                "model_name": step.get("model_name") or agent.get("model_name"),
                "agent": f"{agent.get('name')} {agent.get('version')}",
            },
        },
        **step_fields(step.get("extra"), trajectory.get("extra")),
    )


def _messages(step: dict) -> list[dict]:
    """The chat messages a step adds: its own message (or reply), then its observation's results."""
    source = step.get("source")
    if source == "agent":
        added = [_reply(step)]
    elif isinstance(source, str) and source in ROLES:
        added = [{"role": ROLES[source], "content": _content(step.get("message"), "message")}]
    else:
        raise BadRecord("wrong_type", f"source is {source!r}, expected system, user or agent")
    observation = optional(step, "observation", dict)
    results = (observation or {}).get("results") or []
    if not isinstance(results, list):
        raise BadRecord("wrong_type", "observation.results is not an array")
    for result in results:
        if not isinstance(result, dict):
            raise BadRecord("wrong_type", "an observation result is not an object")
        content = _content(result.get("content") or "", "observation content")
        call = optional(result, "source_call_id", str, "observation result")
        added.append(
            {"role": "tool", "tool_call_id": call, "content": content} if call else {"role": "user", "content": content}
        )
    return added


def _reply(step: dict) -> dict:
    reply: dict[str, Any] = {"role": "assistant", "content": _content(step.get("message"), "message")}
    if optional(step, "reasoning_content", str) is not None:
        reply["reasoning_content"] = step["reasoning_content"]
    calls = optional(step, "tool_calls", list)
    if calls:
        reply["tool_calls"] = [_tool_call(call) for call in calls]
    return reply


def _tool_call(call: Any) -> dict:
    if not isinstance(call, dict):
        raise BadRecord("wrong_type", "a tool call is not an object")
    arguments = need(call, "arguments", dict, "tool call")
    return {
        "id": need(call, "tool_call_id", str, "tool call"),
        "type": "function",
        "function": {"name": need(call, "function_name", str, "tool call"), "arguments": json.dumps(arguments)},
    }


def _content(value: Any, label: str) -> str | list:
    """Text, or a list of (multimodal) content parts, kept as written."""
    if value is None:
        raise BadRecord("missing_field", f"{label} is missing")
    if not isinstance(value, (str, list)):
        raise BadRecord("wrong_type", f"{label} is a {type(value).__name__}, expected text or content parts")
    return value
