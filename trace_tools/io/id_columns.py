"""Record batches made ready for rows (`io.load`): the token-id columns checked in range at once and
turned into lists of the process's shared ints (or int32 arrays, which a replay makes lists where
it replays the session: `materialize_ids`, `pipeline.recorded`), oversized cells nulled before
anything decodes them, timestamps read as UTC."""

from __future__ import annotations

from dataclasses import fields
from typing import Any

import pyarrow as pa

from trace_tools.data import Session, Turn
from trace_tools.ids import array_prefix, shared_ints
from trace_tools.io.rows import (
    records,
)
from trace_tools.io.schema import (
    INT32_MAX,
)

_UTC_US = pa.timestamp("us", tz="UTC")


def batch_ids_ok(batch: pa.RecordBatch, vocab_size: int | None) -> frozenset[str]:
    """Token-id columns of a batch whose every value is non-null and in range, checked at once."""
    bound = vocab_size if vocab_size is not None else INT32_MAX + 1
    ok = []
    for name in ("output_ids", "prompt_ids"):
        index = batch.schema.get_field_index(name)
        if index < 0 or not (
            pa.types.is_list(batch.column(index).type) or pa.types.is_large_list(batch.column(index).type)
        ):
            continue
        values, _ = list_values(batch.column(index))
        if values.null_count or not pa.types.is_integer(values.type):
            continue
        ids = values.to_numpy()  # no nulls: a view of the values
        if not len(ids) or (ids.min() >= 0 and ids.max() < bound):
            ok.append(name)
    return frozenset(ok)


def batch_records(batch: pa.RecordBatch, checked: frozenset[str], as_arrays: bool) -> list[dict[str, Any]]:
    """The batch's rows as dicts (`rows.records`). The token-id columns in `checked` (in range)
    become lists of shared int objects (a 50k-token prompt is then 400 kB of pointers, not 1.8 MB
    of ints), or with `as_arrays` int32 arrays, which cross to worker processes as plain bytes
    and which a recorded prompt stays until it is compared with its render (`pipeline.recorded`)."""
    plain = batch.drop_columns(list(checked)) if checked else batch
    rows = records(plain)
    for name in checked:
        values = _id_arrays(batch.column(name)) if as_arrays else _interned_lists(batch.column(name))
        for row, ids in zip(rows, values):
            row[name] = ids
    return rows


def _rows_of(column: pa.Array) -> tuple[Any, list[int], list[int], Any]:
    """(flat values, row starts, row ends, validity) of a list<int> column."""
    values, offsets = list_values(column)
    return values.to_numpy(zero_copy_only=False), offsets[:-1].tolist(), offsets[1:].tolist(), validity(column)


def list_values(column: pa.Array) -> tuple[pa.Array, Any]:
    """(the child values a list column's rows span, each row's bounds in them: n + 1 offsets),
    read off its buffers (`ListArray.flatten` imports `pyarrow.compute`; see `validity`)."""
    import numpy as np

    if not len(column):
        return column.values.slice(0, 0), np.zeros(1, dtype=np.int64)
    offsets = _offsets(column)
    base = int(offsets[0])
    return column.values.slice(base, int(offsets[-1]) - base), offsets.astype(np.int64) - base


def _interned_lists(column: pa.Array) -> list[list[int] | None]:
    """A list<int> column's rows, each a list of the process-wide shared int objects."""
    flat, starts, ends, valid = _rows_of(column)
    # Row by row: one list per row, without a whole-column list to slice copies from.
    return _shared_lists([flat[a:b] if ok else None for a, b, ok in zip(starts, ends, valid)])


def _shared_lists(rows: list[Any]) -> list[list[int] | None]:
    """Integer arrays as lists of the shared int objects (`SharedLists`)."""
    convert = SharedLists()
    return [convert(row) for row in rows]


class SharedLists:
    """Converts integer arrays, one after another, into lists of the shared int objects
    (`_int_objects`); anything else (lists, None) passes unchanged.

    An array that starts with the one before it (a session's prompt repeats its history) copies
    that array's list and converts only the rest: a list copy touches each element once, a
    conversion three times, and the history is nearly all of a long prompt. `follows` says which
    list stands for an array that was not converted here (a prompt equal to its render becomes
    the render's list: `pipeline.recorded`)."""

    def __init__(self) -> None:
        self._previous: Any = None
        self._previous_list: list[int] = []

    def __call__(self, row: Any) -> list[int] | None:
        if not is_id_array(row):  # a list, or None: nothing to convert (and anything else is not ours to guess)
            self._previous = None
            return row
        return self.listed(row)

    def listed(self, row: Any) -> list[int]:
        """The list of an integer array."""
        import numpy as np

        objects = _int_objects(int(row.max()) + 1 if len(row) else 0)
        previous = self._previous
        n = len(previous) if previous is not None else 0
        if 0 < n <= len(row) and np.array_equal(row[:n], previous):
            ids = self._previous_list.copy()
            ids += objects[row[n:]].tolist()
        else:
            ids = objects[row].tolist()
        self.follows(row, ids)
        return ids

    def follows(self, row: Any, ids: list[int]) -> None:
        """`ids` is the list of the array `row`: the next array may extend it."""
        self._previous, self._previous_list = row, ids


def _id_arrays(column: pa.Array) -> list[Any]:
    """A list<int> column's rows as int32 arrays (copies, so the batch is not kept alive)."""
    import numpy as np

    flat, starts, ends, valid = _rows_of(column)
    flat = flat.astype(np.int32, copy=False)
    return [flat[a:b].copy() if ok else None for a, b, ok in zip(starts, ends, valid)]


class ShippedSession:
    """A session on its way to a worker process, pickled small: a turn's recorded prompt ids (an
    int32 array, `id_arrays=True`) travel as how many ids it shares with the previous turn's
    prompt and the ids after them. A session's prompts repeat its history, so its prompt arrays
    hold each id many times: 108 MB of the 116 MB the benchmark's 40 sessions pickled to, against
    15 MB this way, which took less than half the time to pickle and to unpickle. The session
    handed over is not changed; the worker finds `session` as it was (its prompt arrays rebuilt)."""

    __slots__ = ("session",)

    def __init__(self, session: Session):
        self.session = session

    def __getstate__(self) -> tuple[Any, ...]:
        session = self.session
        turns = []
        previous = None
        for turn in session.turns:
            values = [getattr(turn, name) for name in _TURN_FIELDS]
            ids = values[_PROMPT]
            if is_id_array(ids) and is_id_array(previous):
                shared = array_prefix(previous, ids)
                values[_PROMPT] = (shared, ids[shared:])
            previous = ids
            turns.append(values)
        return {name: getattr(session, name) for name in _SESSION_FIELDS}, turns

    def __setstate__(self, state: tuple[Any, ...]) -> None:
        import numpy as np

        others, packed = state
        turns = []
        previous: Any = None  # the previous turn's prompt, rebuilt
        for values in packed:
            ids = values[_PROMPT]
            if isinstance(ids, tuple):
                shared, rest = ids
                ids = values[_PROMPT] = np.concatenate((previous[:shared], rest))
            previous = ids
            turns.append(Turn(*values))
        self.session = Session(turns=turns, **others)


_TURN_FIELDS = tuple(field_.name for field_ in fields(Turn))
_SESSION_FIELDS = tuple(field_.name for field_ in fields(Session) if field_.name != "turns")
_PROMPT = _TURN_FIELDS.index("prompt_ids")


def is_id_array(value: Any) -> bool:
    return type(value).__name__ == "ndarray"  # without importing numpy where no array is shipped


def materialize_ids(session: Session, prompts: bool = True) -> Session:
    """Turn the int32 id arrays that a stream opened with `id_arrays=True` hands out into lists of
    shared ints, in place: the data model's `list[int]`, what strategies work on. `prompts=False`
    leaves the recorded prompts as arrays, for the replay to compare with their renders before it
    makes them lists (`pipeline.recorded`)."""
    for name in ("output_ids", "prompt_ids") if prompts else ("output_ids",):
        for turn, ids in zip(session.turns, _shared_lists([getattr(turn, name) for turn in session.turns])):
            setattr(turn, name, ids)
    return session


_INT_OBJECTS: list[Any] = []


def _int_objects(size: int) -> Any:
    """An object array whose i-th entry is the int i: `ids.shared_ints`'s objects, so recorded and
    tokenized ids compare by pointer."""
    import numpy as np

    if not _INT_OBJECTS or len(_INT_OBJECTS[0]) < size:
        table = shared_ints(size)
        objects = np.empty(len(table), dtype=object)
        objects[:] = table
        _INT_OBJECTS[:] = [objects]
    return _INT_OBJECTS[0]


def without_oversized(batch: pa.RecordBatch, limit: int) -> tuple[pa.RecordBatch, dict[int, str]]:
    """The batch with every cell over `limit` bytes nulled before anything decodes it, and for each
    such row (by position) what was too large; `io.session_checks.row_turn` quarantines its session."""
    oversized: dict[int, str] = {}
    columns = list(batch.columns)
    for index, (name, column) in enumerate(zip(batch.schema.names, batch.columns)):
        cells = oversized_rows(column, limit)
        for position, size in cells.items():
            oversized.setdefault(
                position, f"{name} holds {size:,} bytes, over the cell limit of {limit:,} ($TRACE_TOOLS_MAX_CELL_BYTES)"
            )
        if cells:
            columns[index] = null_rows(column, cells)
    return (pa.RecordBatch.from_arrays(columns, schema=batch.schema), oversized) if oversized else (batch, oversized)


def oversized_rows(column: pa.Array, limit: int) -> dict[int, int]:
    """Row position → size in bytes of the cells of `column` larger than `limit`, measured on
    Arrow's buffers (nothing decoded): a string's bytes, a list's items times their width."""
    import numpy as np

    kind = column.type
    if not len(column) or pa.types.is_dictionary(kind):
        return {}  # values shared through a dictionary are counted where they are stored
    if (
        pa.types.is_string(kind)
        or pa.types.is_large_string(kind)
        or pa.types.is_binary(kind)
        or (pa.types.is_large_binary(kind))
    ):
        width = 1
    elif pa.types.is_list(kind) or pa.types.is_large_list(kind):
        width = max(kind.value_type.bit_width // 8 if pa.types.is_primitive(kind.value_type) else 8, 1)
    else:
        return {}
    sizes = np.diff(_offsets(column)).astype(np.int64) * width
    sizes[~validity(column)] = 0  # a null cell holds nothing
    if sizes.max() <= limit:
        return {}
    return {position: int(sizes[position]) for position in np.flatnonzero(sizes > limit).tolist()}


def _offsets(column: pa.Array) -> Any:
    """The n + 1 offsets of a non-empty string, binary or list column's rows, off its buffer."""
    import numpy as np

    kind = column.type
    large = pa.types.is_large_string(kind) or pa.types.is_large_binary(kind) or pa.types.is_large_list(kind)
    offsets = np.frombuffer(column.buffers()[1], dtype=np.int64 if large else np.int32)
    return offsets[column.offset : column.offset + len(column) + 1]


def validity(column: pa.Array) -> Any:
    """A bool array: which rows of `column` are not null, read off its validity bitmap. (Not
    `Array.is_valid()`: that imports `pyarrow.compute`, 30 ms that a command reading a dump pays
    before its workers fork and in each of them.)"""
    import numpy as np

    if not column.null_count:
        return np.ones(len(column), dtype=bool)
    bits = np.frombuffer(column.buffers()[0], dtype=np.uint8)
    return np.unpackbits(bits, bitorder="little")[column.offset : column.offset + len(column)].astype(bool)


def null_rows(column: pa.Array, rows: dict[int, int]) -> pa.Array:
    """`column` with the cells at `rows` made null (the oversized ones, never decoded)."""
    if not rows:
        return column
    import pyarrow.compute as pc

    mask = pa.array([position in rows for position in range(len(column))])
    return pc.if_else(mask, pa.scalar(None, column.type), column)


def utc_batch(batch: pa.RecordBatch) -> pa.RecordBatch:
    """Timestamps of any unit or zone as timestamp[us, UTC]; naive ones are taken to be UTC
    (docs/trace_schema.md#columns)."""
    # A column already in that type is kept as it is: a cast, even to its own type, imports
    # pyarrow.compute (40 ms of the replaying process's start, which needs it nowhere else).
    columns = [
        column.cast(_UTC_US, safe=False) if pa.types.is_timestamp(column.type) and column.type != _UTC_US else column
        for column in batch.columns
    ]
    return pa.RecordBatch.from_arrays(columns, names=batch.schema.names)
