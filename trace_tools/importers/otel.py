"""OpenTelemetry GenAI spans of model calls, with token ids (docs/importers.md#formats).

Two line shapes, told apart by content, may be mixed:

* **OTLP/JSON** (the OTLP exporter's JSON encoding, one `ExportTraceServiceRequest` a line):
  `{"resourceSpans": [{"resource": {"attributes": [...]}, "scopeSpans": [{"spans": [{"traceId",
  "spanId", "name", "startTimeUnixNano", "endTimeUnixNano", "attributes": [{"key", "value":
  {"stringValue" | "intValue" | "doubleValue" | "boolValue" | "arrayValue" | "kvlistValue"}}],
  "status": {"code"}}]}]}]}`;
* **one span a line** as Agent Lightning's store keeps it (microsoft/agent-lightning v0.3.1,
  `f0a77cf`, `agentlightning/types/tracer.py` `Span`): `{"rollout_id", "attempt_id", "trace_id",
  "span_id", "name", "attributes": {flat}, "start_time", "end_time" (epoch seconds), "status",
  "resource": {"attributes": {flat}}}`.

A span is a model call when it carries token ids or chat messages (or `gen_ai.operation.name`
is `chat` / `text_completion`); other spans (agent operations, tools, rewards) are not calls and
are skipped. Messages come from the GenAI semantic conventions' `parts` JSON (semconv
`1cf2476`), else from the flattened `gen_ai.prompt.<i>.role` / `.content` / `.tool_calls.<j>.*` /
`.tool_call_id` that OpenLLMetry-style instrumentation writes (Agent Lightning's AgentOps tracer,
LiteLLM's OTel callback). A call's fields, first match wins:

| column | attributes |
|---|---|
| `messages` | `gen_ai.system_instructions` + `gen_ai.input.messages` (`parts` JSON), else `gen_ai.prompt.<i>.*` |
| `response`, `finish_reason` | `gen_ai.output.messages[0]`, else `gen_ai.completion.0.*` |
| `prompt_ids` | `prompt_token_ids`, `llm.hosted_vllm.prompt_token_ids` (LiteLLM, as text) |
| `output_ids` | `response_token_ids` (Agent Lightning), `llm.hosted_vllm.response_token_ids` (first list) |
| `output_logprobs` | `logprobs.content` (JSON text, `[{token, logprob}]`) |
| `tools` | `gen_ai.tool.definitions`, else `llm.request.functions.<i>.name` / `.description` / `.parameters` |
| `request_id` | `gen_ai.response.id` |
| `step`, `weight_version` | attributes of those names on the span, else its resource |

`--session-key` (required) names the span attribute, else resource attribute, else span field
that holds the session: `agentlightning.rollout_id` (a resource attribute), `rollout_id`,
`gen_ai.conversation.id`, `traceId`. Spans are exported as they end, so `turn_index` is the call's
rank by span start time within its session, not its line. A span whose status is an error is a
rejected request. Token-id attributes may be arrays or JSON text; anything else is `wrong_type`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from typing import Any

from trace_tools.data import Turn
from trace_tools.importers.base import (
    BadRecord,
    Options,
    Outcome,
    logprobs,
    make_turn,
    messages,
    step_fields,
    timestamp,
    token_ids,
)

PROMPT_IDS = ("prompt_token_ids", "llm.hosted_vllm.prompt_token_ids")
OUTPUT_IDS = ("response_token_ids", "llm.hosted_vllm.response_token_ids")
CALL_OPERATIONS = ("chat", "text_completion")


def outcomes(value: dict, where: str, options: Options) -> Iterator[Outcome]:
    try:
        spans = list(_spans(value, where))
    except BadRecord as bad:  # the line's structure is broken: which spans it held is unknown
        yield Outcome(None, where, reason=bad.reason, detail=bad.detail)
        return
    for span, resource, here in spans:
        if _is_call(span["attributes"]):
            yield _outcome(span, resource, here, options)


# -- the two line shapes, as (span with flat attributes and start/end seconds, resource attributes) ---


def _spans(value: dict, where: str) -> Iterator[tuple[dict, dict, str]]:
    if "resourceSpans" not in value:
        span = {**value, "attributes": _object(value.get("attributes") or {}, "span attributes")}
        resource = _object(value.get("resource") or {}, "span resource")
        yield span, _object(resource.get("attributes") or {}, "resource attributes"), where
        return
    for r, block in enumerate(_array(value["resourceSpans"], "resourceSpans")):
        block = _object(block, "a resourceSpans entry")
        resource = _attributes(_object(block.get("resource") or {}, "resource").get("attributes"))
        for s, scope in enumerate(_array(block.get("scopeSpans") or [], "scopeSpans")):
            for n, span in enumerate(_array(_object(scope, "a scopeSpans entry").get("spans") or [], "spans")):
                here = f"{where} resourceSpans[{r}].scopeSpans[{s}].spans[{n}]"
                yield _otlp_span(_object(span, "a span")), resource, here


def _object(value: Any, label: str) -> dict:
    if not isinstance(value, dict):
        raise BadRecord("bad_json", f"{label} is a {type(value).__name__}, not an object")
    return value


def _array(value: Any, label: str) -> list:
    if not isinstance(value, list):
        raise BadRecord("bad_json", f"{label} is a {type(value).__name__}, not an array")
    return value


def _otlp_span(span: dict) -> dict:
    flat = {k: v for k, v in span.items() if k != "attributes"}
    flat["attributes"] = _attributes(span.get("attributes"))
    flat["start_time"] = _nanos(span.get("startTimeUnixNano"))
    flat["end_time"] = _nanos(span.get("endTimeUnixNano"))
    return flat


def _attributes(pairs: Any) -> dict[str, Any]:
    """OTLP `[{"key", "value": AnyValue}]` as a flat dict (a malformed pair is left out)."""
    if pairs is None:
        return {}
    _array(pairs, "attributes")
    return {
        p["key"]: _any_value(p.get("value")) for p in pairs if isinstance(p, dict) and isinstance(p.get("key"), str)
    }


def _any_value(value: Any) -> Any:
    if not isinstance(value, dict):
        return None
    if "arrayValue" in value:
        return [_any_value(v) for v in (value["arrayValue"] or {}).get("values") or []]
    if "kvlistValue" in value:
        return _attributes((value["kvlistValue"] or {}).get("values"))
    if "intValue" in value:  # int64 is a decimal string in OTLP/JSON
        raw = value["intValue"]
        return int(raw) if isinstance(raw, (int, str)) and str(raw).lstrip("-").isdigit() else raw
    for kind in ("stringValue", "doubleValue", "boolValue", "bytesValue"):
        if kind in value:
            return value[kind]
    return None


def _nanos(value: Any) -> float | None:
    try:
        return int(value) / 1e9 if value is not None else None
    except (TypeError, ValueError):
        return None


# -- one span --------------------------------------------------------------------------------------


def _is_call(attributes: dict) -> bool:
    keys = attributes.keys()
    return (
        attributes.get("gen_ai.operation.name") in CALL_OPERATIONS
        or any(k in attributes for k in (*PROMPT_IDS, *OUTPUT_IDS, "gen_ai.input.messages"))
        or any(k.startswith("gen_ai.prompt.") for k in keys)
    )


def _outcome(span: dict, resource: dict, where: str, options: Options) -> Outcome:
    session_id = _session(span, resource, options.session_key or "")
    start = span.get("start_time")
    order = float(start) if isinstance(start, (int, float)) and not isinstance(start, bool) else None
    order = order if order is not None and math.isfinite(order) else None
    if session_id is None:
        detail = f"span has no attribute or field {options.session_key!r}; pass --session-key naming the session"
        return Outcome(None, where, reason="no_session", detail=detail, order=order)
    error = _error(span.get("status"))
    if error is not None:
        return Outcome(session_id, where, rejected=error, order=order)
    try:
        return Outcome(session_id, where, turn=_turn(span, resource, session_id, where, options), order=order)
    except BadRecord as bad:
        return Outcome(session_id, where, reason=bad.reason, detail=bad.detail, order=order)


def _session(span: dict, resource: dict, key: str) -> str | None:
    value = next(
        (place[key] for place in (span["attributes"], resource, span) if place.get(key) is not None),
        None,
    )
    if isinstance(value, bool) or not isinstance(value, (str, int)) or value == "":
        return None
    return str(value)


def _error(status: Any) -> str | None:
    """'span status error: message' for an OTLP error code (2) or the store's ERROR, else None."""
    if not isinstance(status, dict):
        return None
    code = status.get("code", status.get("status_code"))
    if code not in (2, "2", "STATUS_CODE_ERROR", "ERROR"):
        return None
    message = status.get("message") or status.get("description")
    return "span status error" + (f": {message}" if message else "")


def _turn(span: dict, resource: dict, session_id: str, where: str, options: Options) -> Turn:
    attributes = span["attributes"]
    output_ids = _ids(attributes, OUTPUT_IDS, options, required=True) or []
    prompt_ids = _ids(attributes, PROMPT_IDS, options, required=False)
    reply = _reply(attributes)
    values = _logprobs(attributes.get("logprobs.content"), len(output_ids))
    return make_turn(
        session_id,
        messages=messages(_prompt(attributes), "gen_ai.input.messages / gen_ai.prompt.*"),
        output_ids=output_ids,
        output_logprobs=values,
        prompt_ids=prompt_ids,
        tools=_tools(attributes),
        response=reply,
        finish_reason=reply.pop("finish_reason", None) if reply else None,
        request_id=attributes.get("gen_ai.response.id")
        if isinstance(attributes.get("gen_ai.response.id"), str)
        else None,
        started_at=timestamp(span.get("start_time"), "span start"),
        finished_at=timestamp(span.get("end_time"), "span end"),
        metadata={
            "import": {"format": options.format, "source": where},
            "span": {k: span.get(k) for k in ("name", "trace_id", "traceId", "span_id", "spanId") if span.get(k)},
        },
        **step_fields(attributes, resource),
    )


def _ids(attributes: dict, names: tuple[str, ...], options: Options, *, required: bool) -> list[int] | None:
    name = next((n for n in names if attributes.get(n) is not None), None)
    if name is None:
        if required:
            raise BadRecord(
                "missing_field",
                f"model-call span without output token ids ({', '.join(names)}); record with token ids returned",
            )
        return None
    value = _json_text(attributes[name], name)
    if name.startswith("llm.hosted_vllm.response") and isinstance(value, list) and value and isinstance(value[0], list):
        value = value[0]  # LiteLLM keeps one list per choice
    return token_ids(value, name, options.vocab_size)


def _logprobs(value: Any, expected: int) -> list[float] | None:
    if value is None:
        return None
    entries = _json_text(value, "logprobs.content")
    if not isinstance(entries, list):
        raise BadRecord("wrong_type", "logprobs.content is not an array")
    raw = [entry.get("logprob") if isinstance(entry, dict) else entry for entry in entries]
    return logprobs(raw, "logprobs.content[*].logprob", expected)


def _json_text(value: Any, label: str) -> Any:
    """A value that instrumentation may have written as JSON text (OTel attributes hold no objects)."""
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value)
    except ValueError:
        raise BadRecord("wrong_type", f"{label} is text that is not JSON") from None


# -- messages: the semantic conventions' parts, or the flattened prompt/completion attributes ---------


def _prompt(attributes: dict) -> list[dict] | None:
    if attributes.get("gen_ai.input.messages") is not None:
        chat = []
        system = attributes.get("gen_ai.system_instructions")
        if system is not None:
            chat.append({"role": "system", "content": _parts_text(_json_text(system, "gen_ai.system_instructions"))})
        for message in _json_list(attributes["gen_ai.input.messages"], "gen_ai.input.messages"):
            chat.extend(_from_parts(message))
        return chat
    flat = _unflatten(attributes, "gen_ai.prompt.")
    return [_from_flat(message) for message in flat] if flat else None


def _reply(attributes: dict) -> dict | None:
    if attributes.get("gen_ai.output.messages") is not None:
        outputs = _json_list(attributes["gen_ai.output.messages"], "gen_ai.output.messages")
        if not outputs:
            return None
        [reply] = _from_parts(outputs[0])
        if isinstance(outputs[0], dict) and isinstance(outputs[0].get("finish_reason"), str):
            reply["finish_reason"] = outputs[0]["finish_reason"]
        return reply
    flat = _unflatten(attributes, "gen_ai.completion.")
    if not flat or not isinstance(flat[0], dict):
        return None
    reply = _from_flat(flat[0])
    if isinstance(flat[0].get("finish_reason"), str):
        reply["finish_reason"] = flat[0]["finish_reason"]
    return reply


def _json_list(value: Any, label: str) -> list:
    parsed = _json_text(value, label)
    if not isinstance(parsed, list):
        raise BadRecord("wrong_type", f"{label} is not an array of messages")
    return parsed


def _from_parts(message: Any) -> list[dict]:
    """A semantic-conventions message (`role`, `parts`) as chat messages (a tool message per response part)."""
    if not isinstance(message, dict) or not isinstance(message.get("parts"), list):
        raise BadRecord("wrong_type", "a gen_ai message is not an object with a parts array")
    role, parts = message.get("role"), [p for p in message["parts"] if isinstance(p, dict)]
    if role == "tool":
        return [
            {"role": "tool", "tool_call_id": p.get("id"), "content": _text_of(p.get("response"))}
            for p in parts
            if p.get("type") == "tool_call_response"
        ]
    chat: dict[str, Any] = {"role": role, "content": _parts_text(parts)}
    reasoning = [str(p.get("content", "")) for p in parts if p.get("type") == "reasoning"]
    if reasoning:
        chat["reasoning_content"] = "".join(reasoning)
    calls = [p for p in parts if p.get("type") == "tool_call"]
    if calls:
        chat["tool_calls"] = [_tool_call(p.get("id"), p.get("name"), p.get("arguments")) for p in calls]
    return [chat]


def _parts_text(parts: Any) -> str:
    if not isinstance(parts, list):
        raise BadRecord("wrong_type", "message parts are not an array")
    return "".join(str(p.get("content", "")) for p in parts if isinstance(p, dict) and p.get("type") == "text")


def _from_flat(message: dict) -> dict:
    """A flattened `gen_ai.prompt.<i>.*` message as a chat message."""
    if not isinstance(message, dict):
        raise BadRecord("wrong_type", "gen_ai.prompt.<i> / gen_ai.completion.<i> is a plain value, not a message")
    chat: dict[str, Any] = {
        k: v for k, v in message.items() if k in ("role", "content", "reasoning_content", "tool_call_id", "name")
    }
    calls = message.get("tool_calls")
    if isinstance(calls, list) and calls:
        chat["tool_calls"] = [
            _tool_call(c.get("id"), c.get("name"), c.get("arguments")) for c in calls if isinstance(c, dict)
        ]
    return chat


def _tool_call(call_id: Any, name: Any, arguments: Any) -> dict:
    if not isinstance(name, str):
        raise BadRecord("wrong_type", f"a tool call's name is {name!r}, not text")
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": _text_of(arguments)}}


def _text_of(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def _unflatten(attributes: dict, prefix: str) -> list:
    """`prefix.0.role`, `prefix.0.tool_calls.1.name`, ... as a list of nested objects (index order)."""
    root: dict[str, Any] = {}
    for key, value in attributes.items():
        if key.startswith(prefix):
            node = root
            *path, last = key[len(prefix) :].split(".")
            for part in path:
                node = node.setdefault(part, {})
                if not isinstance(node, dict):
                    raise BadRecord("wrong_type", f"attribute {key} nests under a plain value")
            node[last] = value
    found = _indexed(root)
    if not isinstance(found, list):
        raise BadRecord("wrong_type", f"{prefix}* attributes are not numbered ({prefix}0.role, ...)")
    return found


def _indexed(node: Any) -> Any:
    """Nested dicts whose keys are all indices as lists in index order, at every depth."""
    if not isinstance(node, dict):
        return node
    converted = {key: _indexed(value) for key, value in node.items()}
    if all(key.isdigit() for key in converted):  # an empty dict too: no such attributes
        return [converted[key] for key in sorted(converted, key=int)]
    return converted


def _tools(attributes: dict) -> list[dict] | None:
    if attributes.get("gen_ai.tool.definitions") is not None:
        tools = _json_text(attributes["gen_ai.tool.definitions"], "gen_ai.tool.definitions")
        if not isinstance(tools, list):
            raise BadRecord("wrong_type", "gen_ai.tool.definitions is not an array")
        return tools
    functions = _unflatten(attributes, "llm.request.functions.")
    if not functions:
        return None
    tools = []
    for function in functions:
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise BadRecord("wrong_type", "llm.request.functions entry has no name")
        described = {k: function[k] for k in ("name", "description") if k in function}
        if "parameters" in function:
            described["parameters"] = _json_text(function["parameters"], "llm.request.functions parameters")
        tools.append({"type": "function", "function": described})
    return tools
