"""miles session-server records (docs/importers.md#formats).

A `SessionRecord` is `{timestamp, request_timestamp?, method, path, request, response,
status_code}`: `request` is the body miles sent to the engine (the client's `messages`, `tools`
and sampling fields, plus the TITO prompt `input_ids` and the effective `chat_template_kwargs`),
`response` the engine's chat completion with `choices[0].meta_info.output_token_logprobs`.
Two shapes, told apart by content, may be mixed in one source:

* a **session document**, what `GET /sessions/{id}` returns: `{session_id, records: [...],
  metadata}` (in a `.json` file, an array of them, or one per line);
* a **per-request record**, one JSON line per record as a per-request logger writes it: a
  `SessionRecord` plus its session id under `session_id` (or the field `--session-key` names).

Output ids and logprobs come from `meta_info.output_token_logprobs`, the prompt ids from
`request.input_ids`, the stored response from `choices[0].message`. A record with a status
other than 200 is a rejected request. Records miles itself would refuse with a 502 (no
`meta_info`, null `message.content`, `completion_tokens` disagreeing with the ids) are malformed.
"""

from __future__ import annotations

from collections.abc import Iterator

from trace_tools.importers.base import BadRecord, Options, Outcome, attempt, call_outcome, need, session_of
from trace_tools.importers.openai import exchange_turn, first_choice, sglang_output


def outcomes(value: dict, where: str, options: Options) -> Iterator[Outcome]:
    if "records" in value:
        yield from _document(value, where, options)
    else:
        yield call_outcome(
            value, where, options, ("session_id",), lambda session_id: _turn(value, session_id, where, options)
        )


def _document(document: dict, where: str, options: Options) -> Iterator[Outcome]:
    session_id = session_of(document, None, ("session_id",))
    records = document.get("records")
    if session_id is None or not isinstance(records, list):
        problem = "no session_id" if session_id is None else "records is not an array"
        yield Outcome(
            session_id,
            where,
            reason="no_session" if session_id is None else "wrong_type",
            detail=f"session document with {problem}",
        )
        return
    for position, record in enumerate(records):
        here = f"{where} records[{position}]"
        if not isinstance(record, dict):
            yield Outcome(session_id, here, reason="bad_json", detail="a record is not a JSON object")
        else:
            yield attempt(session_id, here, record, lambda: _turn(record, session_id, here, options))


def _turn(record: dict, session_id: str, where: str, options: Options):
    request, response = need(record, "request", dict), need(record, "response", dict)
    message = need(first_choice(response), "message", dict, "response.choices[0]")
    if message.get("content") is None:
        raise BadRecord("missing_field", "response.choices[0].message.content is null (miles answers 502 for it)")
    return exchange_turn(
        request,
        response,
        session_id,
        where,
        options,
        output_of=sglang_output,
        started=record.get("request_timestamp"),
        finished=record.get("timestamp"),
    )
