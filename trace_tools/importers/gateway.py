"""Per-call traces of slime / agentcore-style rollout gateways (docs/importers.md#formats).

Such a gateway owns tokenization, so each call it logs carries the ids it fed the engine and the
ids the engine sampled: agentcore's and slime's `TurnRecord` (`prompt_ids`, `output_ids`,
`finish_reason`, `output_log_probs`, `ill_formed`) next to the request the adapter rendered
(`messages`, `tools`) and the parsed reply; agentcore's older rllm-gateway path names the ids
`prompt` / `completion` and the episode `gateway_session_id`. One call a line (JSON lines), or a
`.json` array of calls. Accepted names, first match wins:

| column | fields |
|---|---|
| session | `session_id`, `gateway_session_id`, `sid` (or `--session-key`) |
| `messages` | `messages`, `prompt_messages` |
| `prompt_ids` | `prompt_ids`, `prompt_token_ids`, `prompt` |
| `output_ids` | `output_ids`, `completion_ids`, `completion_token_ids`, `completion` |
| `output_logprobs` | `output_log_probs`, `output_logprobs`, `logprobs`, `completion_logprobs` |
| `response` | `response_message`, `response` |
| `finish_reason` | `finish_reason`, `finish` |

`tools`, `chat_template_kwargs`, `reward`, `request_id`, `started_at`, `finished_at` (or
`timestamp`), `step` and `weight_version` keep their names; every other plain field (`ill_formed`,
`task_index`, …) goes to the row's metadata. An empty `output_log_probs` means "not recorded"
(TurnRecord's default). A call without `messages` cannot be replayed (the strategies route on
messages) and is malformed.
"""

from __future__ import annotations

from collections.abc import Iterator

from trace_tools.importers.base import (
    BadRecord,
    Options,
    Outcome,
    call_outcome,
    finish_reason,
    first_of,
    logprobs,
    make_turn,
    messages,
    optional,
    scalars,
    step_fields,
    timestamp,
    token_ids,
)

SESSION = ("session_id", "gateway_session_id", "sid")
FIELDS = {
    "messages": ("messages", "prompt_messages"),
    "prompt_ids": ("prompt_ids", "prompt_token_ids", "prompt"),
    "output_ids": ("output_ids", "completion_ids", "completion_token_ids", "completion"),
    "output_logprobs": ("output_log_probs", "output_logprobs", "logprobs", "completion_logprobs"),
    "response": ("response_message", "response"),
    "finish_reason": ("finish_reason", "finish"),
}
_KEPT = (
    "tools",
    "chat_template_kwargs",
    "reward",
    "request_id",
    "started_at",
    "finished_at",
    "timestamp",
    "step",
    "weight_version",
)


def outcomes(value: dict, where: str, options: Options) -> Iterator[Outcome]:
    yield call_outcome(value, where, options, SESSION, lambda session_id: _turn(value, session_id, where, options))


def _turn(call: dict, session_id: str, where: str, options: Options):
    found = {column: first_of(call, names) for column, names in FIELDS.items()}
    ids_name, ids = found["output_ids"]
    if ids is None:
        raise BadRecord("missing_field", f"no output ids (fields {', '.join(FIELDS['output_ids'])})")
    output_ids = token_ids(ids, ids_name, options.vocab_size)
    lp_name, lps = found["output_logprobs"]
    prompt_name, prompt = found["prompt_ids"]
    response = found["response"][1]
    if response is not None and not isinstance(response, dict):
        raise BadRecord(
            "wrong_type", f"{found['response'][0]} is a {type(response).__name__}, expected a message object"
        )
    reward = optional(call, "reward", (int, float))
    used = {name for name, _ in found.values()} | set(_KEPT)
    return make_turn(
        session_id,
        messages=messages(found["messages"][1], found["messages"][0]),
        output_ids=output_ids,
        output_logprobs=logprobs(lps, lp_name, len(output_ids)) if lps else None,
        prompt_ids=None if prompt is None else token_ids(prompt, prompt_name, options.vocab_size),
        tools=optional(call, "tools", list),
        response=response,
        finish_reason=finish_reason(found["finish_reason"][1]),
        request_id=optional(call, "request_id", str),
        started_at=timestamp(call.get("started_at"), "started_at"),
        finished_at=timestamp(first_of(call, ("finished_at", "timestamp"))[1], "finished_at"),
        chat_template_kwargs=optional(call, "chat_template_kwargs", dict),
        reward=None if reward is None else float(reward),
        **step_fields(call),
        metadata={"import": {"format": options.format, "source": where}, **scalars(call, skip=tuple(used) + SESSION)},
    )
