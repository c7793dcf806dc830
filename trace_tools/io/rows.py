"""Row validation (docs/trace_schema.md#loading-validation-and-quarantine): the one gate every row
passes before any layer sees it as a `Turn`.

`turn_from_record` checks a row already typed by Arrow and builds its `Turn`, or raises `BadRow`
with a reason from the fixed vocabulary and a detail naming the column, position and value. Every
data problem that replay could otherwise meet later is found here, so `validate` and `replay`
agree: text that is not valid UTF-8 or holds lone surrogates (`bad_text`, which tokenizers
reject), messages without a role or with a malformed body (`bad_message`), logprobs that are
NaN, infinite or positive (`bad_logprob`), on top of the schema checks.

`text_values` / `records` read string cells so that one cell of invalid UTF-8 becomes a `BadText`
value (its row is quarantined) instead of an exception that would lose the whole file.
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass
from typing import Any, Callable

import pyarrow as pa

from trace_tools.data import Turn
from trace_tools.errors import UsageError
from trace_tools.io.schema import INT32_MAX, REQUIRED

# A JSON \u escape of a UTF-16 surrogate; json.loads pairs valid ones, so only then can a lone one remain.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")
_TEXT_COLUMNS = ("finish_reason", "request_id")
_JSON_COLUMNS = (("tools", list), ("response", dict), ("chat_template_kwargs", dict), ("metadata", dict))


MAX_JSON_DEPTH = 100  # real messages and tool schemas nest a dozen levels; recursion in later layers needs room
MAX_CELL_BYTES = 64 * 2**20  # a cell larger than this quarantines its session (`cell_too_large`)


def max_cell_bytes() -> int:
    """The cell size limit: `$TRACE_TOOLS_MAX_CELL_BYTES`, else `MAX_CELL_BYTES`."""

    text = os.environ.get("TRACE_TOOLS_MAX_CELL_BYTES", "")
    if not text:
        return MAX_CELL_BYTES
    if not text.isdigit() or int(text) < 1:
        raise UsageError(f"$TRACE_TOOLS_MAX_CELL_BYTES is {text!r}; set a positive number of bytes or unset it")
    return int(text)


class TooDeep(ValueError):
    """JSON nested deeper than `MAX_JSON_DEPTH` (or than the parser can follow)."""

    def __init__(self) -> None:
        super().__init__(f"nested deeper than {MAX_JSON_DEPTH} levels")


def parse_json(text: str) -> Any:
    """`json.loads`, refusing (`TooDeep`) what nests deeper than `MAX_JSON_DEPTH`: the parser
    itself overflows Python's recursion limit around a thousand levels, and every later layer that
    walks the value recursively would, far below it."""
    try:
        value = json.loads(text)
    except RecursionError:
        raise TooDeep() from None
    if text.count("[") + text.count("{") > MAX_JSON_DEPTH and _deeper_than(value, MAX_JSON_DEPTH):
        raise TooDeep()
    return value


def _deeper_than(value: Any, limit: int) -> bool:
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if type(item) is dict else item if type(item) is list else ()
        for child in children:
            if type(child) is dict or type(child) is list:
                if depth + 1 > limit:
                    return True
                stack.append((child, depth + 1))
    return False


class BadRow(Exception):
    def __init__(self, reason: str, detail: str):
        super().__init__(detail)
        self.reason, self.detail = reason, detail


@dataclass(frozen=True)
class BadText:
    """A string cell that is not valid UTF-8: its raw bytes and the offset of the first bad byte."""

    raw: bytes
    offset: int

    @property
    def lossy(self) -> str:
        """A stable printable stand-in (undecodable bytes as \\x escapes), e.g. to name a session."""
        return self.raw.decode("utf-8", "backslashreplace")


# ---------------------------------------------------------------------------------------------
# Reading string cells without losing the file to one bad byte


def text_values(column: pa.Array | pa.ChunkedArray) -> list[Any]:
    """A string column's values; a cell of invalid UTF-8 becomes `BadText` instead of raising."""
    try:
        return column.to_pylist()
    except UnicodeDecodeError:
        return [None if raw is None else _decode(raw) for raw in _as_binary(column).to_pylist()]


def records(batch: pa.RecordBatch) -> list[dict[str, Any]]:
    """The batch's rows as dicts (`RecordBatch.to_pylist`), string cells read by `text_values`."""
    try:
        return batch.to_pylist()
    except UnicodeDecodeError:
        columns = [text_values(column) if _is_text(column.type) else column.to_pylist() for column in batch.columns]
        return [dict(zip(batch.schema.names, row)) for row in zip(*columns)]


def _decode(raw: bytes) -> str | BadText:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as error:
        return BadText(raw, error.start)


def _is_text(arrow_type: pa.DataType) -> bool:
    if pa.types.is_dictionary(arrow_type):
        arrow_type = arrow_type.value_type
    return pa.types.is_string(arrow_type) or pa.types.is_large_string(arrow_type) or str(arrow_type) == "string_view"


def _as_binary(column: pa.Array | pa.ChunkedArray) -> pa.Array | pa.ChunkedArray:
    if pa.types.is_dictionary(column.type):
        column = column.dictionary_decode()
    return column.cast(pa.large_binary() if pa.types.is_large_string(column.type) else pa.binary())


# ---------------------------------------------------------------------------------------------
# One row


class HistoryParser:
    """`json.loads` for one session's `messages` and `tools` cells, reusing the previous row's parse.

    Each request repeats the conversation so far. When a cell's text starts with the previous
    cell's array minus its closing bracket, followed by a comma, only the appended elements are
    parsed, and the earlier ones are the previous row's objects (shared, never mutated): parsing
    and everything downstream (canonicalization, render caches) then work per new message. A
    session's `tools` cell is usually the same text on every row and is parsed once.
    """

    def __init__(self) -> None:
        self._body: str | None = None
        self._value: list[Any] = []
        self._tools: tuple[str, Any] | None = None
        self.reused = 0  # leading elements of the latest value that are the previous row's objects
        self.reused_chars = 0  # leading characters of the latest text that are the previous row's

    def tools(self, text: str) -> Any:
        if self._tools is None or self._tools[0] != text:
            self._tools = (text, parse_json(text))
        return self._tools[1]

    def __call__(self, text: str) -> Any:
        reused, reused_chars = len(self._value), len(self._body or "")
        value = self._extend(text)
        if value is None:
            value, reused, reused_chars = parse_json(text), 0, 0
        self.reused, self.reused_chars = reused, reused_chars
        if isinstance(value, list):
            body = text.rstrip()
            self._body = body[:-1].rstrip() if body.endswith("]") else None
            self._value = value
        return value

    def _extend(self, text: str) -> list[Any] | None:
        body = self._body
        if not body or len(body) < 2 or not text.startswith(body):
            return None
        rest = text[len(body) :].lstrip()
        if not rest.startswith(","):
            return None
        try:
            tail = parse_json("[" + rest[1:])
        except ValueError:
            return None  # the full parse reports the error
        return self._value + tail if isinstance(tail, list) else None


def turn_from_record(
    record: dict[str, Any],
    vocab_size: int | None,
    parser: HistoryParser | None = None,
    ids_checked: frozenset[str] = frozenset(),
) -> Turn:
    """Validate one row (already typed by Arrow) and build its Turn, or raise BadRow.

    `parser` is the session's `HistoryParser`; `ids_checked` names the token-id columns whose whole
    record batch was already found null-free and in range."""
    _check_text(record)
    for name in REQUIRED:
        if name != "messages" and record.get(name) is None:  # null messages is `empty_messages`
            raise BadRow("missing_column", f"null {name}")
    if record["turn_index"] < 0:
        raise BadRow("negative_turn", f"turn_index is {record['turn_index']}")
    messages = _messages(record, parser or parse_json)
    output_ids = _token_ids(record, "output_ids", vocab_size, "output_ids" in ids_checked)
    output_ids = [] if output_ids is None else output_ids  # not null: checked above
    logprobs = _logprobs(record, len(output_ids))
    values = {
        name: _json_value(record, name, kind, parser.tools if parser and name == "tools" else parse_json)
        for name, kind in _JSON_COLUMNS
    }
    _check_tools(values["tools"])
    if values["response"] is not None:
        _check_message(values["response"], "response", need_role=False)
    reward = record.get("reward")
    return Turn(
        session_id=str(record["session_id"]),
        turn_index=int(record["turn_index"]),
        messages=messages,
        output_ids=output_ids,
        tools=values["tools"],
        output_logprobs=logprobs,
        prompt_ids=_token_ids(record, "prompt_ids", vocab_size, "prompt_ids" in ids_checked),
        response=values["response"],
        finish_reason=record.get("finish_reason"),
        request_id=record.get("request_id"),
        started_at=record.get("started_at"),
        finished_at=record.get("finished_at"),
        chat_template_kwargs=values["chat_template_kwargs"],
        reward=None if reward is None else float(reward),
        metadata=values["metadata"],
        step=_step(record),
        weight_version=record.get("weight_version"),
    )


def _step(record: dict[str, Any]) -> int | None:
    step = record.get("step")
    return None if step is None else int(step)


def _check_text(record: dict[str, Any]) -> None:
    for name, value in record.items():
        if isinstance(value, BadText):
            raise BadRow(
                "bad_text",
                f"{name} is not valid UTF-8 (byte {value.offset}: {value.raw[value.offset : value.offset + 4]!r})",
            )


def short(value: str, limit: int = 40) -> str:
    return repr(value) if len(value) <= limit else f"{value[:limit]!r}… ({len(value)} chars)"


def _json_value(record: dict[str, Any], name: str, expected: type, parse: Callable[[str], Any] = parse_json) -> Any:
    """Parse a JSON column; None stays None; anything but `expected` (list or dict) is `bad_json`."""
    text = record.get(name)
    if text is None:
        return None
    try:
        value = parse(text)
    except TooDeep as error:
        raise BadRow("bad_json", f"{name} is {error}") from None
    except ValueError as error:
        raise BadRow(
            "bad_json",
            f"{name} is not valid JSON ({getattr(error, 'msg', error)} "
            f"at char {getattr(error, 'pos', '?')}): {short(text)}",
        ) from None
    if value is not None and not isinstance(value, expected):
        kind = "array" if expected is list else "object"
        raise BadRow("bad_json", f"{name} holds a JSON {type(value).__name__}, not a JSON {kind} or null")
    # Text a session's parser reused was searched with the row it came from (`_messages`).
    if _SURROGATE_ESCAPE.search(text, getattr(parse, "reused_chars", 0)):
        _check_surrogates(value, name)
    return value


def _check_surrogates(value: Any, where: str) -> None:
    """A lone UTF-16 surrogate (only a JSON escape can make one) is text no tokenizer accepts."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as error:
            raise BadRow(
                "bad_text", f"{where} holds a lone surrogate {value[error.start]!r} at char {error.start}"
            ) from None
    elif isinstance(value, dict):
        for key, item in value.items():
            _check_surrogates(key, where)
            _check_surrogates(item, f"{where}.{key}")
    elif isinstance(value, list):
        for position, item in enumerate(value):
            _check_surrogates(item, f"{where}[{position}]")


def _messages(record: dict[str, Any], parse: Callable[[str], Any] = parse_json) -> list[dict[str, Any]]:
    messages = _json_value(record, "messages", list, parse)
    if not messages:
        raise BadRow("empty_messages", "messages is null" if messages is None else "messages is an empty array")
    # A session's parser hands back the previous row's messages as they were: checked with that row
    # (a row that fails ends its session's reading, so nothing unchecked is ever reused).
    checked = getattr(parse, "reused", 0)
    for position, message in enumerate(messages[checked:], checked):
        if not isinstance(message, dict):
            raise BadRow("bad_json", f"messages[{position}] is a JSON {type(message).__name__}, not an object")
        _check_message(message, f"messages[{position}]")
    return messages


def _check_message(message: dict[str, Any], where: str, need_role: bool = True) -> None:
    """What every template and canonicalization relies on: a role, a text or parts body, tool calls."""
    role = message.get("role")
    if (need_role or role is not None) and not (isinstance(role, str) and role.strip()):
        detail = "has no role" if role is None else f"role is {role!r}, not a role name"
        raise BadRow("bad_message", f"{where} {detail}")
    content = message.get("content")
    if content is not None and not isinstance(content, (str, list)):
        raise BadRow("bad_message", f"{where}.content is a {type(content).__name__}, not text, parts or null")
    calls = message.get("tool_calls")
    if calls is not None and not isinstance(calls, list):
        raise BadRow("bad_message", f"{where}.tool_calls is a {type(calls).__name__}, not an array")
    for position, call in enumerate(calls or ()):
        function = call.get("function") if isinstance(call, dict) else None
        if not (isinstance(function, dict) and isinstance(function.get("name"), str)):
            raise BadRow("bad_message", f"{where}.tool_calls[{position}] has no function name")
        if not isinstance(function.get("arguments"), (str, dict, type(None))):
            raise BadRow(
                "bad_message", f"{where}.tool_calls[{position}].function.arguments is neither text nor an object"
            )


def _check_tools(tools: list[Any] | None) -> None:
    for position, tool in enumerate(tools or ()):
        if not isinstance(tool, dict):
            raise BadRow("bad_json", f"tools[{position}] is a JSON {type(tool).__name__}, not an object")


def _token_ids(record: dict[str, Any], name: str, vocab_size: int | None, checked: bool = False) -> list[int] | None:
    """Check ids against [0, vocab_size); without a vocabulary only against [0, int32 max]."""
    ids = record.get(name)
    if ids is None or checked:
        return ids
    if None in ids:
        raise BadRow("wrong_type", f"{name}[{ids.index(None)}] is null, not a token id")
    bound = vocab_size if vocab_size is not None else INT32_MAX + 1
    if ids and (min(ids) < 0 or max(ids) >= bound):
        position, bad = next((i, t) for i, t in enumerate(ids) if t < 0 or t >= bound)
        limit = f"vocabulary size {vocab_size}" if vocab_size is not None else "int32 range"
        raise BadRow("out_of_vocab", f"{name}[{position}] = {bad} is outside [0, {bound}) ({limit})")
    return ids


def _logprobs(record: dict[str, Any], outputs: int) -> list[float] | None:
    """Sampling logprobs: one per output id, each finite and <= 0 (a probability of at most 1)."""
    logprobs = record.get("output_logprobs")
    if logprobs is None:
        return None
    if len(logprobs) != outputs:
        raise BadRow("logprobs_length", f"output_logprobs has {len(logprobs)} values for {outputs} output_ids")
    if None in logprobs:
        raise BadRow("wrong_type", f"output_logprobs[{logprobs.index(None)}] is null, not a logprob")
    if logprobs and not (math.isfinite(sum(logprobs)) and max(logprobs) <= 0.0):  # a NaN or inf makes the sum so
        bad = next(((i, v) for i, v in enumerate(logprobs) if not (v <= 0.0 and math.isfinite(v))), None)
        if bad is not None:
            raise BadRow(
                "bad_logprob",
                f"output_logprobs[{bad[0]}] = {bad[1]} is not a log-probability (NaN, infinite or positive)",
            )
    return logprobs
