"""What every importer shares: reading sources, the per-record outcome, and the checks on a turn.

A format module turns one parsed JSON value (a log line, or a whole `.json` document) into
`Outcome`s, one per generation call it describes: a `Turn` (its `turn_index` is assigned later,
by arrival order within the session), a rejected request (the server answered non-200), or a
malformed record with a reason from `IMPORT_REASONS`. Nothing here writes files; see
`trace_tools.importers.run`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from trace_tools.data import Turn
from trace_tools.errors import UnusableInput

# Why a source record did not become a turn. Most mirror the loader's row reasons
# (docs/trace_schema.md#loading-validation-and-quarantine) for the same faults; the rest exist only before schema v1.
IMPORT_REASONS = (
    "bad_json",  # a line or file that is not JSON, or JSON of the wrong shape
    "missing_field",  # a field the format requires is absent or null
    "wrong_type",  # a field of the wrong type (e.g. strings where token ids belong)
    "empty_messages",  # no chat messages: schema v1 cannot replay a request without them
    "logprobs_length",  # logprobs and output ids of different lengths
    "bad_logprob",  # a NaN, infinite or positive logprob
    "out_of_vocab",  # a token id outside the tokenizer's vocabulary
    "count_mismatch",  # the engine's own token count disagrees with the ids it returned
    "no_session",  # the record names no session (see --session-key)
    "session_quarantined",  # a sound record of a session that holds a malformed one
)
REJECTED = "rejected_request"  # the server refused the request (non-200): kept, counted, not a turn


class BadRecord(Exception):
    """A record that cannot become a turn; `reason` is one of IMPORT_REASONS."""

    def __init__(self, reason: str, detail: str):
        super().__init__(detail)
        self.reason, self.detail = reason, detail


@dataclass(slots=True)
class Outcome:
    """What one generation call in the sources became.

    Exactly one of `turn`, `rejected` (the server's status and message) and `reason` is set.
    `session_id` is None only for records that name no session (or are not JSON at all).
    """

    session_id: str | None
    where: str
    turn: Turn | None = None
    rejected: str | None = None
    reason: str | None = None
    detail: str = ""
    order: float | None = None  # where the call falls in its session when arrival is not its order (a span's start)

    @property
    def malformed(self) -> bool:
        return self.reason is not None


@dataclass(frozen=True, slots=True)
class Options:
    """Import settings a format may read."""

    format: str  # the format's name, for each row's `metadata.import.format`
    session_key: str | None = None
    vocab_size: int | None = None
    step_key: str | None = None  # a dotted path to the training step in each source value (--step-key)


# -- reading sources -------------------------------------------------------------------------------


def source_files(sources: Sequence[str | Path], suffixes: Sequence[str]) -> list[Path]:
    """The files to read, in the order given; a directory contributes its files whose names end in one of
    the format's suffixes (`.jsonl`, or a whole name such as `trajectory.json`), sorted."""
    files: list[Path] = []
    for source in sources:
        path = Path(source).expanduser()
        if path.is_dir():
            found = sorted(p for p in path.rglob("*") if p.is_file() and p.name.endswith(tuple(suffixes)))
            if not found:
                raise UnusableInput(
                    f"no {'/'.join(suffixes)} files under {source}; pass log files or a directory of them"
                )
            files.extend(found)
        elif path.is_file():
            files.append(path)
        else:
            raise UnusableInput(f"no such file or directory: {source}; pass log files or a directory of them")
    if not files:
        raise UnusableInput(f"no source files given; pass one or more {'/'.join(suffixes)} files")
    return files


def json_values(path: Path) -> Iterator[tuple[str, Any]]:
    """(where, value) for every JSON value of a file; a value that does not parse is a BadRecord.

    A `.json` file is one document (an object, or an array whose items are documents); any other
    file is JSON lines, read one line at a time, blank lines skipped.
    """
    if path.suffix == ".json":
        yield from _whole_file(path)
        return
    with open(path, encoding="utf-8", errors="surrogateescape") as handle:
        for number, line in enumerate(handle, start=1):
            if line.strip():
                yield f"{path.name}:{number}", _parse(line)


def _whole_file(path: Path) -> Iterator[tuple[str, Any]]:
    value = _parse(path.read_text(encoding="utf-8", errors="surrogateescape"))
    if isinstance(value, list):
        for position, item in enumerate(value):
            yield f"{path.name}[{position}]", item
    else:
        yield path.name, value


def _parse(text: str) -> Any:
    from trace_tools.io.rows import TooDeep, parse_json

    try:
        return parse_json(text)
    except TooDeep as error:
        return BadRecord("bad_json", f"JSON {error}")
    except ValueError as error:
        where = f"{getattr(error, 'msg', error)} at char {getattr(error, 'pos', '?')}"
        return BadRecord("bad_json", f"not valid JSON ({where})")


# -- field access ----------------------------------------------------------------------------------


def need(record: dict, name: str, kind: type | tuple[type, ...], where: str = "") -> Any:
    """`record[name]`, which must be present, non-null and of `kind`."""
    label = f"{where}.{name}" if where else name
    value = record.get(name)
    if value is None:
        raise BadRecord("missing_field", f"{label} is missing")
    if not _is(value, kind):
        raise BadRecord("wrong_type", f"{label} is a {type(value).__name__}, expected {_names(kind)}")
    return value


def optional(record: dict, name: str, kind: type | tuple[type, ...], where: str = "") -> Any:
    """`record[name]` when present and non-null (it must then be of `kind`), else None."""
    return None if record.get(name) is None else need(record, name, kind, where)


def first_of(record: dict, names: tuple[str, ...]) -> tuple[str, Any]:
    """(name, value) of the first of `names` present with a non-null value, else (names[0], None)."""
    for name in names:
        if record.get(name) is not None:
            return name, record[name]
    return names[0], None


def dotted(record: Any, path: str) -> Any:
    """`record["a"]["b"]` for path `a.b`; None where any step is missing."""
    value = record
    for part in path.split("."):
        if not isinstance(value, dict):
            return None
        value = value.get(part)
    return value


def _is(value: Any, kind: type | tuple[type, ...]) -> bool:
    # JSON true/false load as bool, which Python counts as int; only an explicit bool kind takes them.
    return bool in _kinds(kind) if isinstance(value, bool) else isinstance(value, kind)


def _kinds(kind: type | tuple[type, ...]) -> tuple[type, ...]:
    return kind if isinstance(kind, tuple) else (kind,)


def _names(kind: type | tuple[type, ...]) -> str:
    words = {dict: "an object", list: "an array", str: "a string", int: "an integer", float: "a number"}
    return " or ".join(words.get(k, k.__name__) for k in _kinds(kind))


def token_ids(value: Any, label: str, vocab_size: int | None) -> list[int]:
    """A list of token ids, each an integer in [0, vocab_size) (or the int32 range without a vocabulary)."""
    if not isinstance(value, list):
        raise BadRecord("wrong_type", f"{label} is a {type(value).__name__}, expected an array of token ids")
    bound = vocab_size if vocab_size is not None else 2**31
    for position, item in enumerate(value):
        if not isinstance(item, int) or isinstance(item, bool):
            raise BadRecord("wrong_type", f"{label}[{position}] is {item!r}, not a token id")
        if not 0 <= item < bound:
            limit = f"vocabulary size {vocab_size}" if vocab_size is not None else "int32 range"
            raise BadRecord("out_of_vocab", f"{label}[{position}] = {item} is outside [0, {bound}) ({limit})")
    return value


def logprobs(value: Any, label: str, expected: int) -> list[float]:
    """Sampling logprobs: numbers, finite, <= 0, one per output token."""
    if not isinstance(value, list):
        raise BadRecord("wrong_type", f"{label} is a {type(value).__name__}, expected an array of numbers")
    for position, item in enumerate(value):
        if not isinstance(item, (int, float)) or isinstance(item, bool):
            raise BadRecord("wrong_type", f"{label}[{position}] is {item!r}, not a number")
        if not math.isfinite(item) or item > 0:
            raise BadRecord("bad_logprob", f"{label}[{position}] = {item} is not a finite logprob <= 0")
    if len(value) != expected:
        raise BadRecord("logprobs_length", f"{label} has {len(value)} values for {expected} output ids")
    return [float(item) for item in value]


def messages(value: Any, label: str) -> list[dict]:
    """Chat messages: a non-empty array of objects, each with a string `role`."""
    if value is None or value == []:
        raise BadRecord(
            "empty_messages",
            f"{label} is {'missing' if value is None else 'empty'}; schema v1 needs the chat messages of every request",
        )
    if not isinstance(value, list):
        raise BadRecord("wrong_type", f"{label} is a {type(value).__name__}, expected an array of messages")
    for position, message in enumerate(value):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise BadRecord("wrong_type", f"{label}[{position}] is not a message object with a string role")
    return value


def timestamp(value: Any, label: str) -> datetime | None:
    """Epoch seconds (number) or ISO 8601 text as an aware UTC datetime; None stays None."""
    if value is None:
        return None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        try:
            return datetime.fromtimestamp(float(value), tz=UTC)
        except (ValueError, OverflowError, OSError):  # NaN, infinite, or beyond the calendar
            raise BadRecord("wrong_type", f"{label} is {value!r}, not a timestamp") from None
    if isinstance(value, str):
        try:
            moment = datetime.fromisoformat(value)
        except ValueError:
            raise BadRecord("wrong_type", f"{label} is {value!r}, not a timestamp") from None
        return moment if moment.tzinfo else moment.replace(tzinfo=UTC)
    raise BadRecord("wrong_type", f"{label} is a {type(value).__name__}, not a timestamp")


def status_rejection(record: dict) -> str | None:
    """'status N: message' when the record says the server answered non-200, else None."""
    status = record.get("status_code", 200)
    if status in (200, None):
        return None
    error = next(
        (v for path in ("response.error.message", "response.error", "response.detail") if (v := dotted(record, path))),
        None,
    )
    text = error if isinstance(error, str) else json.dumps(error) if error else ""
    return f"status {status}" + (f": {text}" if text else "")


def finish_reason(value: Any) -> str | None:
    """OpenAI's string, or SGLang's native `{"type": ...}` object."""
    if isinstance(value, dict):
        value = value.get("type")
    return value if isinstance(value, str) else None


def scalars(record: dict, skip: tuple[str, ...] = ()) -> dict[str, Any]:
    """The plain (string, number, boolean) entries of an object: small facts worth keeping in metadata."""
    return {k: v for k, v in record.items() if k not in skip and isinstance(v, (str, int, float, bool))}


def step_fields(*places: Any) -> dict[str, Any]:
    """`step` (an integer, or digits) and `weight_version` (text, or a number written as text) from the
    first of `places` (objects; others are skipped) that holds each, as `make_turn` keywords."""
    found: dict[str, Any] = {"step": None, "weight_version": None}
    for place in (p for p in places if isinstance(p, dict)):
        for name in found:
            if found[name] is None and place.get(name) is not None:
                found[name] = place[name]
    step, version = found["step"], found["weight_version"]
    if isinstance(step, str) and step.strip().isdigit():
        step = int(step)
    if step is not None and (not isinstance(step, int) or isinstance(step, bool) or step < 0):
        raise BadRecord("wrong_type", f"step is {step!r}, expected a non-negative integer")
    if version is not None and (isinstance(version, bool) or not isinstance(version, (str, int, float))):
        raise BadRecord("wrong_type", f"weight_version is a {type(version).__name__}, expected text")
    return {"step": step, "weight_version": None if version is None else str(version)}


def make_turn(session_id: str, *, messages: list[dict], output_ids: list[int], **fields: Any) -> Turn:
    """A Turn whose `turn_index` the writer assigns (arrival order within the session)."""
    return Turn(session_id=session_id, turn_index=-1, messages=messages, output_ids=output_ids, **fields)


def attempt(session_id: str | None, where: str, record: dict, build: Any) -> Outcome:
    """Run `build()` for a record: its Turn, or the server's rejection, or the reason it is malformed."""
    try:
        rejected = status_rejection(record)
        if rejected is not None:
            return Outcome(session_id, where, rejected=rejected)
        return Outcome(session_id, where, turn=build())
    except BadRecord as bad:
        return Outcome(session_id, where, reason=bad.reason, detail=bad.detail)


def call_outcome(
    record: dict, where: str, options: Options, defaults: tuple[str, ...], build: Callable[[str], Turn]
) -> Outcome:
    """A per-call record's outcome: its session (`--session-key`, else the first of `defaults`), then `build`."""
    session_id = session_of(record, options.session_key, defaults)
    if session_id is None:
        looked = f"header or field {options.session_key!r}" if options.session_key else f"fields {', '.join(defaults)}"
        return Outcome(
            None, where, reason="no_session", detail=f"no session id ({looked}); pass --session-key naming it"
        )
    return attempt(session_id, where, record, lambda: build(session_id))


def session_of(record: dict, key: str | None, defaults: tuple[str, ...]) -> str | None:
    """The record's session id: from `key` when given, else the first of `defaults` present.

    `key` is a dotted path from the record's root (`request.metadata.session_id`), or a plain
    name looked up as a request header (case-insensitive, under `headers`), then a field of the
    request body, then a top-level field.
    """
    if key is None:
        value = first_of(record, defaults)[1]
    elif "." in key:
        value = dotted(record, key)
    else:
        value = _header(record, key)
        for place in (record.get("request"), record):
            if value is None and isinstance(place, dict):
                value = place.get(key)
    if isinstance(value, bool) or not isinstance(value, (str, int)) or value == "":
        return None
    return str(value)


def _header(record: dict, name: str) -> Any:
    headers = record.get("headers")
    if not isinstance(headers, dict):
        return None
    return next((v for k, v in headers.items() if str(k).lower() == name.lower()), None)
