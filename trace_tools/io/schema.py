"""Trace schema v1 (docs/trace_schema.md#columns): the column table, the canonical Arrow types, and type compatibility.

A dump written by a real gateway rarely uses exactly the canonical types: pandas writes
`int64` and `large_string`, Polars writes `large_list`, Spark writes `timestamp[ns]` without a
zone. docs/trace_schema.md#columns says such *compatible* physical types are accepted; only an incompatible type
(strings where token ids belong, a float `turn_index`) is a `wrong_type`. `check_field` decides
that for one column of one file; values are checked row by row in `trace_tools.io.load`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import pyarrow as pa

SCHEMA_VERSION = "1"  # what this trace-tools writes
SUPPORTED_SCHEMA_VERSIONS = ("1",)  # what it reads; a dump declaring another is refused
META_PREFIX = "trace_tools."
# DumpMeta fields that have their own `trace_tools.<name>` key; other trace_tools.* keys go to `extra`.
META_FIELDS = ("schema_version", "tokenizer", "chat_template", "history_mode", "harness")

# Column kinds: how a column is stored physically and what its values mean.
STRING, INT, TOKEN_IDS, LOGPROBS, TIMESTAMP, FLOAT = "string", "int", "token_ids", "logprobs", "timestamp", "float"
JSON_ARRAY, JSON_OBJECT = "json_array", "json_object"


@dataclass(frozen=True)
class Column:
    """One column of trace schema v1: its name, kind, whether every file must have it, canonical type."""

    name: str
    kind: str
    required: bool
    arrow_type: pa.DataType


COLUMNS: tuple[Column, ...] = (
    Column("session_id", STRING, True, pa.string()),
    Column("turn_index", INT, True, pa.int32()),
    Column("messages", JSON_ARRAY, True, pa.string()),
    Column("tools", JSON_ARRAY, False, pa.string()),
    Column("output_ids", TOKEN_IDS, True, pa.list_(pa.int32())),
    Column("output_logprobs", LOGPROBS, False, pa.list_(pa.float32())),
    Column("prompt_ids", TOKEN_IDS, False, pa.list_(pa.int32())),
    Column("response", JSON_OBJECT, False, pa.string()),
    Column("finish_reason", STRING, False, pa.string()),
    Column("request_id", STRING, False, pa.string()),
    Column("started_at", TIMESTAMP, False, pa.timestamp("us", tz="UTC")),
    Column("finished_at", TIMESTAMP, False, pa.timestamp("us", tz="UTC")),
    Column("chat_template_kwargs", JSON_OBJECT, False, pa.string()),
    Column("reward", FLOAT, False, pa.float64()),
    Column("metadata", JSON_OBJECT, False, pa.string()),
    Column("step", INT, False, pa.int64()),
    Column("weight_version", STRING, False, pa.string()),
)
COLUMNS_BY_NAME = {column.name: column for column in COLUMNS}
REQUIRED = tuple(column.name for column in COLUMNS if column.required)
JSON_COLUMNS = tuple(column.name for column in COLUMNS if column.kind in (JSON_ARRAY, JSON_OBJECT))
# What sessions_to_table writes: the canonical types, every column nullable except none (nulls
# in required columns are a validation matter, not a schema one).
ARROW_SCHEMA = pa.schema([pa.field(column.name, column.arrow_type) for column in COLUMNS])

# Fixed vocabulary of quarantine reasons (docs/trace_schema.md#loading-validation-and-quarantine).
# `replay_error` is the engine's.
REASONS = (
    "missing_column",
    "wrong_type",
    "bad_json",
    "logprobs_length",
    "out_of_vocab",
    "duplicate_turn",
    "negative_turn",
    "empty_messages",
    "bad_text",
    "bad_message",
    "bad_logprob",
    "cell_too_large",
    "replay_error",
)
# Legal but counted (docs/trace_schema.md#loading-validation-and-quarantine): sessions with a
# turn_index gap, turns with an empty generation.
DATA_WARNINGS = ("turn_index_gap", "empty_generation")
INT32_MAX = 2**31 - 1


def _value_type(t: pa.DataType) -> pa.DataType:
    """Look through dictionary encoding (pandas categoricals), which changes storage, not meaning."""
    return t.value_type if pa.types.is_dictionary(t) else t


def _never(t: pa.DataType) -> bool:
    return False


# View types arrived in pyarrow 16; the project supports 15.
_is_string_view = getattr(pa.types, "is_string_view", _never)
_LIST_TESTS = tuple(
    getattr(pa.types, name, _never)
    for name in ("is_list", "is_large_list", "is_fixed_size_list", "is_list_view", "is_large_list_view")
)


def _is_string(t: pa.DataType) -> bool:
    t = _value_type(t)
    return pa.types.is_string(t) or pa.types.is_large_string(t) or _is_string_view(t)


def _list_item(t: pa.DataType) -> pa.DataType | None:
    return t.value_type if any(test(t) for test in _LIST_TESTS) else None


def _is_int_list(t: pa.DataType) -> bool:
    item = _list_item(t)
    return item is not None and (pa.types.is_integer(item) or pa.types.is_null(item))


def _is_number_list(t: pa.DataType) -> bool:
    item = _list_item(t)
    return item is not None and (pa.types.is_floating(item) or pa.types.is_integer(item) or pa.types.is_null(item))


_COMPATIBLE: dict[str, Callable[[pa.DataType], bool]] = {
    STRING: _is_string,
    JSON_ARRAY: _is_string,
    JSON_OBJECT: _is_string,
    INT: lambda t: pa.types.is_integer(_value_type(t)),
    TOKEN_IDS: _is_int_list,
    LOGPROBS: _is_number_list,
    TIMESTAMP: pa.types.is_timestamp,
    FLOAT: lambda t: pa.types.is_floating(t) or pa.types.is_integer(t),
}
_EXPECTED = {
    STRING: "string",
    JSON_ARRAY: "string holding a JSON array",
    JSON_OBJECT: "string holding a JSON object",
    INT: "an integer type (int32)",
    TOKEN_IDS: "a list of integers (list<int32>)",
    LOGPROBS: "a list of floats (list<float32>)",
    TIMESTAMP: "timestamp (timestamp[us, UTC])",
    FLOAT: "a float (float64)",
}


def expected_type(column: Column) -> str:
    """What a column must hold, in words with its canonical type, e.g. `a list of integers (list<int32>)`."""
    return _EXPECTED[column.kind]


def check_field(column: Column, arrow_type: pa.DataType) -> str | None:
    """None when `arrow_type` can hold `column` (docs/trace_schema.md#columns), else a short 'expected …, found …' text.

    An all-null column (Arrow type `null`, what pandas writes for a column of None) fits any
    column; nulls in required columns are reported per row as `missing_column`.
    """
    if pa.types.is_null(arrow_type) or _COMPATIBLE[column.kind](arrow_type):
        return None
    return f"column {column.name} is {arrow_type}; expected {expected_type(column)}"


def check_schema(schema: pa.Schema) -> list[tuple[str, str, str]]:
    """Every problem with a file's schema as (column, reason, detail), reason `missing_column` or `wrong_type`.

    Columns the schema does not define are ignored (a dump may carry extra columns).
    """
    problems = []
    for column in COLUMNS:
        index = schema.get_field_index(column.name)
        if index < 0:
            if column.required:
                problems.append((column.name, "missing_column", f"required column {column.name} is missing"))
            continue
        mismatch = check_field(column, schema.field(index).type)
        if mismatch:
            problems.append((column.name, "wrong_type", mismatch))
    return problems
