"""Writers for the agent-framework import formats: Harbor ATIF, NeMo Gym rollouts, OpenTelemetry spans.

Each turns the two shared sessions of `import_fixtures.conversations()` into what the upstream
recorder writes (the shapes trace_tools/importers/{atif,nemo_gym,otel}.py document), written by
this code from those documents, never copied. Every fixture records training step 3, served by
weights `step-3`, so the importers' `step` / `weight_version` mapping is tested too.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from trace_tools.data import Session, Turn

STEP, WEIGHTS = 3, "step-3"
REWARDS = {"fix-flaky-test": 1.0, "explain-config": 0.0}


def _added(session: Session) -> list[tuple[list[dict], Turn]]:
    """Per turn: the messages that arrived since the previous reply, and the turn."""
    pairs, seen = [], 0
    for turn in session.turns:
        pairs.append((turn.messages[seen:], turn))
        seen = len(turn.messages) + 1  # its reply is the next turn's history too
    return pairs


# -- Harbor ATIF -----------------------------------------------------------------------------------


def atif_trajectory(session: Session) -> dict[str, Any]:
    """One trial's `agent/trajectory.json` (ATIF v1.5: token ids in each agent step's metrics)."""
    steps: list[dict[str, Any]] = []
    for added, turn in _added(session):
        for message in added:
            if message["role"] == "tool":  # the result observed after the previous agent step's call
                results = steps[-1].setdefault("observation", {"results": []})["results"]
                results.append({"source_call_id": message["tool_call_id"], "content": message["content"]})
            else:
                steps.append({"step_id": len(steps) + 1, "source": message["role"], "message": message["content"]})
        steps.append(_atif_agent_step(len(steps) + 1, turn))
    return {
        "schema_version": "ATIF-v1.5",
        "session_id": session.session_id,
        "agent": {"name": "terminus-2", "version": "2.0.0", "model_name": "policy", "tool_definitions": turn.tools},
        "steps": steps,
        "final_metrics": {"total_completion_tokens": sum(len(t.output_ids) for t in session.turns)},
        "extra": {"step": STEP},
    }


def _atif_agent_step(step_id: int, turn: Turn) -> dict[str, Any]:
    reply = turn.response or {}
    step: dict[str, Any] = {
        "step_id": step_id,
        "timestamp": turn.started_at.isoformat() if turn.started_at else None,
        "source": "agent",
        "model_name": "policy",
        "message": reply.get("content", ""),
    }
    if reply.get("reasoning_content"):
        step["reasoning_content"] = reply["reasoning_content"]
    if reply.get("tool_calls"):
        step["tool_calls"] = [
            {
                "tool_call_id": call["id"],
                "function_name": call["function"]["name"],
                "arguments": json.loads(call["function"]["arguments"]),
            }
            for call in reply["tool_calls"]
        ]
    step["metrics"] = {
        "prompt_tokens": len(turn.prompt_ids or []),
        "completion_tokens": len(turn.output_ids),
        "prompt_token_ids": turn.prompt_ids,
        "completion_token_ids": turn.output_ids,
        "logprobs": turn.output_logprobs,
    }
    step["extra"] = {"weight_version": WEIGHTS}
    return step


def harbor_trial_files(session: Session) -> dict[str, Any]:
    """A trial directory's files, relative to the job: the trajectory, and the verifier's result
    (which the importer does not read: a directory contributes only its trajectory.json files)."""
    trial = f"{session.session_id}__trial"
    result = {"trial_name": trial, "verifier_result": {"rewards": {"reward": REWARDS[session.session_id]}}}
    return {f"{trial}/agent/trajectory.json": atif_trajectory(session), f"{trial}/result.json": result}


# -- NeMo Gym --------------------------------------------------------------------------------------


def nemo_gym_rollout(session: Session, task_index: int) -> dict[str, Any]:
    """One `rollouts.jsonl` line: the Responses-shaped verify response, token ids on each call's last item."""
    first, *_ = _added(session)
    output: list[dict[str, Any]] = []
    for number, (added, turn) in enumerate(_added(session)):
        if number:
            output.extend(_gym_input_item(message) for message in added)
        output.extend(_gym_call_items(turn, number))
    tools = [
        {"type": "function", **{k: t["function"][k] for k in ("name", "description", "parameters")}}
        for t in session.turns[0].tools or []
    ]
    return {
        "responses_create_params": {
            "input": [_gym_input_item(message) for message in first[0]],
            "tools": tools,
            "metadata": {"step": str(STEP), "weight_version": WEIGHTS},
            "parallel_tool_calls": True,
        },
        "response": {"id": f"resp_{session.session_id}", "object": "response", "model": "policy", "output": output},
        "reward": REWARDS[session.session_id],
        "_ng_task_index": task_index,
        "_ng_rollout_index": 0,
        "agent_ref": {"name": "simple_agent"},
    }


def _gym_input_item(message: dict) -> dict[str, Any]:
    if message["role"] == "tool":
        return {"type": "function_call_output", "call_id": message["tool_call_id"], "output": message["content"]}
    return {"type": "message", "role": message["role"], "content": message["content"]}


def _gym_call_items(turn: Turn, number: int) -> list[dict[str, Any]]:
    reply = turn.response or {}
    items: list[dict[str, Any]] = []
    if reply.get("reasoning_content"):
        summary = [{"type": "summary_text", "text": reply["reasoning_content"]}]
        items.append({"id": f"rs_{number}", "type": "reasoning", "summary": summary})
    calls = reply.get("tool_calls") or []
    if reply.get("content") or not (items or calls):
        text = [{"type": "output_text", "text": reply.get("content", ""), "annotations": []}]
        items.append(
            {"id": f"msg_{number}", "type": "message", "role": "assistant", "status": "completed", "content": text}
        )
    for call in calls:
        function = call["function"]
        items.append(
            {
                "type": "function_call",
                "id": call["id"],
                "call_id": call["id"],
                "name": function["name"],
                "arguments": function["arguments"],
                "status": "completed",
            }
        )
    items[-1].update(
        prompt_token_ids=turn.prompt_ids,
        generation_token_ids=turn.output_ids,
        generation_log_probs=turn.output_logprobs,
    )
    return items


# -- OpenTelemetry ---------------------------------------------------------------------------------


def _nanos(moment) -> str:
    return str(int(moment.timestamp() * 1_000_000_000))


def _any_value(value: Any) -> dict[str, Any]:
    """An OTLP/JSON AnyValue (int64 as a decimal string, as the encoding requires)."""
    if isinstance(value, bool):
        return {"boolValue": value}
    if isinstance(value, int):
        return {"intValue": str(value)}
    if isinstance(value, float):
        return {"doubleValue": value}
    if isinstance(value, list):
        return {"arrayValue": {"values": [_any_value(v) for v in value]}}
    return {"stringValue": value}


def _otlp_attributes(flat: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"key": key, "value": _any_value(value)} for key, value in flat.items()]


def _flattened(prefix: str, message: dict) -> dict[str, Any]:
    """A chat message as OpenLLMetry-style `gen_ai.prompt.<i>.*` attributes."""
    flat = {f"{prefix}.{k}": v for k, v in message.items() if k != "tool_calls"}
    for j, call in enumerate(message.get("tool_calls") or []):
        flat[f"{prefix}.tool_calls.{j}.id"] = call["id"]
        flat[f"{prefix}.tool_calls.{j}.name"] = call["function"]["name"]
        flat[f"{prefix}.tool_calls.{j}.arguments"] = call["function"]["arguments"]
    return flat


def _token_attributes(turn: Turn) -> dict[str, Any]:
    return {
        "prompt_token_ids": turn.prompt_ids,
        "response_token_ids": turn.output_ids,
        "logprobs.content": json.dumps(
            [{"token": f"id:{t}", "logprob": lp} for t, lp in zip(turn.output_ids, turn.output_logprobs or [])]
        ),
        "gen_ai.response.id": turn.request_id,
        "gen_ai.request.model": "policy",
        "weight_version": WEIGHTS,
    }


def agentops_span_attributes(turn: Turn) -> dict[str, Any]:
    """What Agent Lightning's AgentOps tracer records on a chat-completion span (flattened messages)."""
    flat: dict[str, Any] = {"gen_ai.operation.name": "chat"}
    for i, message in enumerate(turn.messages):
        flat.update(_flattened(f"gen_ai.prompt.{i}", message))
    flat.update(_flattened("gen_ai.completion.0", turn.response or {}))
    flat["gen_ai.completion.0.finish_reason"] = turn.finish_reason
    for i, tool in enumerate(turn.tools or []):
        function = tool["function"]
        flat[f"llm.request.functions.{i}.name"] = function["name"]
        flat[f"llm.request.functions.{i}.description"] = function["description"]
        flat[f"llm.request.functions.{i}.parameters"] = json.dumps(function["parameters"])
    return flat | _token_attributes(turn)


def otlp_export_lines(sessions: list[Session]) -> list[dict[str, Any]]:
    """OTLP/JSON export requests, one per session and batch: each session's spans are exported as they
    end, here the second call before the first (so line order is not call order), plus an agent span."""
    lines = []
    for session in sessions:
        resource = {
            "agentlightning.rollout_id": session.session_id,
            "agentlightning.attempt_id": "attempt-0",
            "step": STEP,
        }
        spans = [_otlp_span(session, turn, number) for number, turn in enumerate(session.turns)]
        agent = {
            "traceId": _trace(session),
            "spanId": "a" * 16,
            "name": "agentlightning.operation",
            "kind": 1,
            "startTimeUnixNano": _nanos(session.turns[0].started_at),
            "endTimeUnixNano": _nanos(session.turns[-1].finished_at),
            "attributes": _otlp_attributes({"agentlightning.operation.name": "solve"}),
            "status": {},
        }
        scope = {"scope": {"name": "agentops"}, "spans": [*reversed(spans), agent]}
        lines.append(
            {"resourceSpans": [{"resource": {"attributes": _otlp_attributes(resource)}, "scopeSpans": [scope]}]}
        )
    return lines


def _trace(session: Session) -> str:
    return session.session_id.encode().hex()[:32].ljust(32, "0")


def _otlp_span(session: Session, turn: Turn, number: int) -> dict[str, Any]:
    return {
        "traceId": _trace(session),
        "spanId": f"{number + 1:016x}",
        "parentSpanId": "a" * 16,
        "name": "openai.chat.completion",
        "kind": 3,
        "startTimeUnixNano": _nanos(turn.started_at),
        "endTimeUnixNano": _nanos(turn.finished_at),
        "attributes": _otlp_attributes(agentops_span_attributes(turn)),
        "status": {"code": 1},
    }


def _parts(message: dict) -> list[dict[str, Any]]:
    """A chat message as GenAI semantic-conventions parts."""
    if message["role"] == "tool":
        return [{"type": "tool_call_response", "id": message["tool_call_id"], "response": message["content"]}]
    parts: list[dict[str, Any]] = []
    if message.get("reasoning_content"):
        parts.append({"type": "reasoning", "content": message["reasoning_content"]})
    parts.append({"type": "text", "content": message.get("content", "")})
    for call in message.get("tool_calls") or []:
        arguments = json.loads(call["function"]["arguments"])
        parts.append({"type": "tool_call", "id": call["id"], "name": call["function"]["name"], "arguments": arguments})
    return parts


def semconv_span_attributes(turn: Turn) -> dict[str, Any]:
    """A chat span in the GenAI semantic conventions: system instructions, input and output messages as JSON."""
    system = [m for m in turn.messages if m["role"] == "system"]
    rest = [m for m in turn.messages if m["role"] != "system"]
    output = {"role": "assistant", "parts": _parts(turn.response or {}), "finish_reason": turn.finish_reason}
    return {
        "gen_ai.operation.name": "chat",
        "gen_ai.system_instructions": json.dumps([{"type": "text", "content": m["content"]} for m in system]),
        "gen_ai.input.messages": json.dumps([{"role": m["role"], "parts": _parts(m)} for m in rest]),
        "gen_ai.output.messages": json.dumps([output]),
        "gen_ai.tool.definitions": json.dumps(turn.tools),
    } | _token_attributes(turn)


def store_span_lines(sessions: list[Session]) -> list[dict[str, Any]]:
    """Agent Lightning store spans, one a line, newest call first, with a reward span per rollout."""
    lines = []
    for session in sessions:
        base = {"rollout_id": session.session_id, "attempt_id": "attempt-0", "trace_id": _trace(session)}
        resource = {"attributes": {"agentlightning.rollout_id": session.session_id, "step": STEP}, "schema_url": ""}
        for number, turn in reversed(list(enumerate(session.turns))):
            lines.append(
                base
                | {
                    "sequence_id": number + 1,
                    "span_id": f"{number + 1:016x}",
                    "parent_id": None,
                    "name": "chat",
                    "status": {"status_code": "OK", "description": None},
                    "attributes": semconv_span_attributes(turn),
                    "events": [],
                    "links": [],
                    "start_time": turn.started_at.timestamp(),
                    "end_time": turn.finished_at.timestamp(),
                    "resource": resource,
                }
            )
        reward = {
            "agentlightning.reward.0.name": "primary",
            "agentlightning.reward.0.value": REWARDS[session.session_id],
        }
        lines.append(
            base
            | {
                "sequence_id": 9,
                "span_id": "f" * 16,
                "name": "agentlightning.reward",
                "status": {"status_code": "OK"},
                "attributes": reward,
                "start_time": session.turns[-1].finished_at.timestamp(),
                "end_time": session.turns[-1].finished_at.timestamp(),
                "resource": resource,
            }
        )
    return lines


def write_agent_fixtures(directory: Path, sessions: list[Session]) -> list[Path]:
    """The committed fixtures of the three formats (paths under `directory`)."""
    files: dict[str, Any] = {}
    for session in sessions:
        files.update({f"harbor-job/{name}": doc for name, doc in harbor_trial_files(session).items()})
    lines = {
        "nemo_gym_rollouts.jsonl": [nemo_gym_rollout(s, number) for number, s in enumerate(sessions)],
        "otel_otlp_spans.jsonl": otlp_export_lines(sessions),
        "otel_store_spans.jsonl": store_span_lines(sessions),
    }
    written = []
    for name, document in files.items():
        path = directory / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(document, indent=1) + "\n")
        written.append(path)
    for name, records in lines.items():
        (directory / name).write_text("".join(json.dumps(r) + "\n" for r in records))
        written.append(directory / name)
    return written
