"""OpenAI chat-completion exchange logs with token ids, as SGLang and vLLM return them.

One exchange a line (JSON lines), or a `.json` array of exchanges:

    {"request":  {chat completion body: "messages", "tools", ..., optionally "input_ids"},
     "response": {chat completion: "id", "choices": [{"message", "finish_reason", ...}], ...},
     "headers":  {request headers, optional},
     "status_code": 200 (optional), "started_at"/"finished_at" (optional, epoch seconds or ISO 8601)}

Output ids and logprobs come from whichever engine wrote the response:
* **SGLang** (`return_meta_info`): `choices[0].meta_info.output_token_logprobs`, a list of
  `[logprob, token_id, (text)]`; `meta_info.completion_tokens` must equal its length. The
  prompt ids are the request's `input_ids` when the client sent ids.
* **vLLM** (`return_token_ids`): `choices[0].token_ids`, logprobs from
  `choices[0].logprobs.content[*].logprob`, the prompt ids from the response's `prompt_token_ids`.

Sessions are whatever the header or field named by `--session-key` says (see
`base.session_of`). A non-200 `status_code` is a rejected request.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from trace_tools.data import Turn
from trace_tools.importers.base import (
    BadRecord,
    Options,
    Outcome,
    call_outcome,
    dotted,
    finish_reason,
    logprobs,
    make_turn,
    messages,
    need,
    optional,
    scalars,
    step_fields,
    timestamp,
    token_ids,
)


def outcomes(value: dict, where: str, options: Options) -> Iterator[Outcome]:
    yield call_outcome(value, where, options, (), lambda session_id: _turn(value, session_id, where, options))


def _turn(exchange: dict, session_id: str, where: str, options: Options) -> Turn:
    return exchange_turn(
        need(exchange, "request", dict),
        need(exchange, "response", dict),
        session_id,
        where,
        options,
        started=exchange.get("started_at"),
        finished=exchange.get("finished_at"),
    )


def exchange_turn(
    request: dict,
    response: dict,
    session_id: str,
    where: str,
    options: Options,
    *,
    started: Any,
    finished: Any,
    output_of: Callable[..., EngineOutput] | None = None,
) -> Turn:
    """The turn one chat-completion exchange describes (miles records are such exchanges too)."""
    choice = first_choice(response)
    output = (output_of or engine_output)(choice, response, options.vocab_size)
    prompt = request.get("input_ids") if request.get("input_ids") is not None else response.get("prompt_token_ids")
    return make_turn(
        session_id,
        messages=messages(request.get("messages"), "request.messages"),
        output_ids=output.ids,
        output_logprobs=output.logprobs,
        prompt_ids=None if prompt is None else token_ids(prompt, "prompt ids", options.vocab_size),
        tools=optional(request, "tools", list, "request"),
        response=need(choice, "message", dict, "response.choices[0]"),
        finish_reason=finish_reason(choice.get("finish_reason")),
        request_id=optional(response, "id", str, "response"),
        started_at=timestamp(started, "started_at"),
        finished_at=timestamp(finished, "finished_at"),
        chat_template_kwargs=optional(request, "chat_template_kwargs", dict, "request"),
        metadata=output.metadata(options.format, where),
        # SGLang reports the weights that served a call in meta_info; a request's metadata may carry the step.
        **step_fields(request.get("metadata"), {"weight_version": output.facts.get("weight_version")}),
    )


# -- engine outputs (shared with the miles importer) -----------------------------------------------


@dataclass(slots=True)
class EngineOutput:
    """Generated ids, their logprobs (or None), the engine's name and its small per-call facts."""

    ids: list[int]
    logprobs: list[float] | None
    engine: str
    facts: dict[str, Any]

    def metadata(self, fmt: str, where: str) -> dict[str, Any]:
        """The row's metadata: where it came from, and the engine's scalar facts (`meta_info`)."""
        found = {"import": {"format": fmt, "source": where, "engine": self.engine}}
        return {**found, "meta_info": self.facts} if self.facts else found


def first_choice(response: dict) -> dict:
    choices = need(response, "choices", list, "response")
    if not choices or not isinstance(choices[0], dict):
        raise BadRecord("missing_field", "response.choices[0] is missing")
    return choices[0]


def engine_output(choice: dict, response: dict, vocab_size: int | None) -> EngineOutput:
    """SGLang's meta_info when present, else vLLM's token_ids; neither is a missing field."""
    if isinstance(choice.get("meta_info"), dict) or isinstance(response.get("meta_info"), dict):
        return sglang_output(choice, response, vocab_size)
    if choice.get("token_ids") is not None:
        return _vllm_output(choice, response, vocab_size)
    raise BadRecord(
        "missing_field",
        "no output token ids: expected SGLang's choices[0].meta_info."
        "output_token_logprobs or vLLM's choices[0].token_ids",
    )


def sglang_output(choice: dict, response: dict, vocab_size: int | None) -> EngineOutput:
    meta = choice.get("meta_info") if isinstance(choice.get("meta_info"), dict) else response.get("meta_info")
    if not isinstance(meta, dict):
        raise BadRecord(
            "missing_field", "meta_info is missing (SGLang returns the output ids in meta_info.output_token_logprobs)"
        )
    entries = need(meta, "output_token_logprobs", list, "meta_info")
    if any(not isinstance(e, list) or len(e) < 2 for e in entries):
        raise BadRecord("wrong_type", "meta_info.output_token_logprobs entries must be [logprob, token_id, ...]")
    ids = token_ids([e[1] for e in entries], "meta_info.output_token_logprobs[*][1]", vocab_size)
    values = logprobs([e[0] for e in entries], "meta_info.output_token_logprobs[*][0]", len(ids))
    count = meta.get("completion_tokens")
    if count is not None and count != len(ids):
        raise BadRecord(
            "count_mismatch",
            f"meta_info.completion_tokens is {count} but output_token_logprobs holds {len(ids)} tokens",
        )
    return EngineOutput(ids, values, "sglang", scalars(meta))


def _vllm_output(choice: dict, response: dict, vocab_size: int | None) -> EngineOutput:
    ids = token_ids(choice["token_ids"], "choices[0].token_ids", vocab_size)
    content = dotted(choice, "logprobs.content")
    values = None
    if content is not None:
        if not isinstance(content, list):
            raise BadRecord("wrong_type", "choices[0].logprobs.content is not an array")
        raw = [entry.get("logprob") if isinstance(entry, dict) else entry for entry in content]
        values = logprobs(raw, "choices[0].logprobs.content[*].logprob", len(ids))
    count = dotted(response, "usage.completion_tokens")
    if isinstance(count, int) and count != len(ids):
        raise BadRecord(
            "count_mismatch", f"usage.completion_tokens is {count} but choices[0].token_ids holds {len(ids)} tokens"
        )
    return EngineOutput(ids, values, "vllm", {})
