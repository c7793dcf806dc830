"""Load and validate a trace dump (docs/trace_schema.md) into `Session` objects, quarantining bad ones.

A dump is one Parquet file or a directory holding Parquet files (found recursively, read in
sorted path order). A session may span row groups and files.

How memory stays bounded
------------------------
Reading is two passes over the files, both by record batch (`ParquetFile.iter_batches`), never
a whole file at once:

1. **Index.** Only the `session_id` column is read. For each session the index keeps its input
   order, where its last row is (file, row), and any file-level problem that condemns it (a
   required column missing from, or a column of incompatible type in, a file holding its rows).
2. **Sessions.** Every schema column is read in small batches in the same order. Each row is
   validated and appended to its session's buffer; a session is finished (validated as a whole
   and handed out) as soon as the batch holding its last row has been read, and its buffer is
   released. Rows of a session already known to be bad are skipped, and a file with a schema
   problem is not read at all (all its sessions are condemned already).

Memory therefore holds the index (a few integers per session), one record batch, and the rows
of the sessions that are *open* at the current read position: the largest session when a dump
is grouped by session (as writers normally do), the sessions recorded concurrently when rows
are in arrival order. Only a dump whose every session spans nearly all of it would make that
the whole dump. `iter_sessions` streams (validation keeps no sessions); `load` collects.

Validation (docs/trace_schema.md#loading-validation-and-quarantine): a bad row quarantines its whole
session. The session gets a `QuarantineEntry` for its first bad row (reason from the fixed
vocabulary, detail naming file, row, column and value; its later rows are not examined), or one per
schema problem of each file holding its rows, or one per duplicated `turn_index`. Every input
session ends up either valid or quarantined. Rows that cannot be attributed to a session (null
`session_id`, or a file without that column) get one entry per file with `session_id` None.
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generator, Iterable, Iterator

import pyarrow as pa

from trace_tools.data import DumpMeta, QuarantineEntry, Session, Turn
from trace_tools.io import storage
from trace_tools.io.dump_files import (  # noqa: F401 (find_files, read_dump_meta, PIECE_ROWS: re-exported)
    PIECE_ROWS,
    batch_rows_within,
    check_schema_version,
    find_files,
    group_start,
    iter_batches,
    merge_keys,
    merged_dump_meta,
    pieces,
    read_dump_meta,
    read_file_schema,
    read_piece,
    split_warning,
    trace_tools_keys,
    unreadable_file,
    vocab_bound,
)
from trace_tools.io.id_columns import (  # noqa: F401 (materialize_ids: re-exported)
    batch_ids_ok,
    batch_records,
    materialize_ids,
    null_rows,
    oversized_rows,
    utc_batch,
    without_oversized,
)
from trace_tools.io.read_ahead import read_ahead
from trace_tools.io.rows import BadText, HistoryParser, max_cell_bytes, text_values
from trace_tools.io.schema import (
    COLUMNS,
    COLUMNS_BY_NAME,
    REQUIRED,
    check_schema,
    expected_type,
)
from trace_tools.io.session_checks import finished_session, row_turn, session_key, session_warnings
from trace_tools.io.storage import Location

INDEX_BATCH_ROWS = 65_536  # pass 1 reads one small column
ROW_BATCH_ROWS = 128  # pass 2 rows can carry 100k-token prompts; keep batches small


@dataclass
class LoadedDump:
    """A loaded dump: valid sessions (turns sorted by `turn_index`), quarantine and provenance.

    `vocab_checked` is False when no vocabulary size was known (no tokenizer, or one whose size
    cannot be determined offline), so the `out_of_vocab` upper bound was not enforced.
    `session_count` counts distinct session ids in the input: `len(sessions)` plus the sessions
    named in `quarantine`. `data_warnings` counts what is legal but worth a look (see
    `SessionStream.data_warnings`).
    """

    sessions: list[Session]
    quarantine: list[QuarantineEntry]
    meta: DumpMeta
    files: list[str]
    rows: int
    vocab_checked: bool
    vocab_size: int | None = None
    session_count: int = 0
    warnings: list[str] = field(default_factory=list)
    data_warnings: dict[str, int] = field(default_factory=dict)

    @property
    def quarantined_sessions(self) -> list[str]:
        """Ids of quarantined sessions, each once, in input order."""
        return list(dict.fromkeys(e.session_id for e in self.quarantine if e.session_id is not None))


# ---------------------------------------------------------------------------------------------
# The two passes


@dataclass
class _FileInfo:
    path: Location
    label: str
    rows: int
    pieces: list[tuple[int, int, int]]  # what loader tasks read: (row group, first row in the file, rows)
    columns: list[str]  # schema-v1 columns present in the file
    problems: list[tuple[str, str, str]]  # (column, reason, detail) from check_schema
    keys: dict[str, str]  # trace_tools.* metadata, prefix stripped
    groups: list[tuple[int, int]]  # each row group's (rows, uncompressed bytes)


@dataclass(slots=True)
class _Span:
    """Where one session's rows are, and what is known to be wrong with it."""

    order: int  # input order, by first row
    last: tuple[int, int]  # (file number, row) of its last row: when pass 2 can finish it
    first_file: int  # its first row's file: the recording metadata the session keeps
    first_row: int
    problems: list[QuarantineEntry] = field(default_factory=list)
    rows: int = 1


@dataclass(slots=True)
class SessionSlot:
    """Where one session's rows are, from pass 1 alone: what a worker needs to read and validate
    them itself (`read_row_group`, then `read_session`), in place of the rows."""

    position: int  # in finishing order (by last row): the order `SessionStream.positioned` hands sessions out
    session_id: str
    first_file: int
    row_groups: list[tuple[int, int]]  # (file number, piece) that may hold its rows, in file order (`pieces`)
    problems: list[QuarantineEntry]  # known from pass 1 (the session is quarantined; nothing to read)
    rows: int = 0  # its rows (turns, as pass 1 counted them): the work its task will have


@dataclass
class DumpContext:
    """What a worker needs, besides a `SessionSlot`, to read and check rows as the stream does
    (one per dump; small)."""

    files: list[Location]
    labels: list[str]
    columns: list[list[str]]  # to read, per file
    vocab: list[int | None]  # out-of-vocab bound, per file
    metas: list[DumpMeta]  # recording metadata, per file
    pieces: list[list[tuple[int, int, int]]]  # (row group, first row, rows) of each piece, per file
    cell_limit: int = 0  # bytes a cell may hold (`io.rows.max_cell_bytes`)


class SessionStream(Iterator["Session | QuarantineEntry"]):
    """Iterator over a dump's sessions: each valid `Session`, and each `QuarantineEntry`.

    Construction finds the files, reads their footers and builds the session index (pass 1),
    so unusable input raises `UnusableInput` at once and `meta`, `files`, `rows`,
    `session_count`, `vocab_checked`, `vocab_size` and `warnings` are known before iterating.
    Iteration (pass 2) yields entries for unattributable rows first, then each session as soon
    as its last row has been read: a `Session`, or its `QuarantineEntry` objects. Once iterated,
    `data_warnings` counts legal oddities of the valid sessions (turn_index gaps, empty
    generations) and `warning_examples` names one of each.
    """

    def __init__(
        self,
        path: str | Path,
        *,
        tokenizer: str | None = None,
        chat_template: str | None = None,
        history_mode: str | None = None,
        harness: str | None = None,
        vocab_size: int | None = None,
        columns: Iterable[str] | None = None,
        id_arrays: bool = False,
    ):
        root = storage.location(path)
        self._id_arrays = id_arrays  # token ids as int32 arrays, to ship to worker processes
        self._cell_limit = max_cell_bytes()
        # Only the columns a command needs are read (the required ones always); validation covers those.
        self._wanted = None if columns is None else set(columns) | set(REQUIRED)
        self._infos = [self._inspect(file, root) for file in find_files(root)]
        self.files = [str(info.path) for info in self._infos]
        self.rows = sum(info.rows for info in self._infos)
        overrides = dict(tokenizer=tokenizer, chat_template=chat_template, history_mode=history_mode, harness=harness)
        self._init_meta(**overrides)
        # Each file keeps its own recording metadata and vocabulary bound, so a directory may mix
        # recordings (e.g. Qwen3 and Qwen3.5 dumps) and each session is checked and rendered as recorded.
        self._file_meta = [merged_dump_meta(info.keys, overrides) for info in self._infos]
        self._file_vocab = [vocab_bound(vocab_size, meta.tokenizer) for meta in self._file_meta]
        self.vocab_size = vocab_bound(vocab_size, self.meta.tokenizer)
        self.vocab_checked = all(bound is not None for bound in self._file_vocab)
        for meta, bound in zip(self._file_meta, self._file_vocab):
            if bound is None and meta.tokenizer:
                self.warnings.append(
                    f"vocabulary size of tokenizer {meta.tokenizer!r} is unknown; "
                    "out-of-vocab check skipped (pass vocab_size or a local tokenizer)"
                )
                break
        self._piece_starts = [[start for _, start, _ in info.pieces] for info in self._infos]
        self.warnings.extend(filter(None, (split_warning(info.label, info.pieces) for info in self._infos)))
        self._spans: dict[str, _Span] = {}
        self._parsers: dict[str, HistoryParser] = {}  # per open session
        self._unattributed: list[QuarantineEntry] = []
        self.data_warnings: dict[str, int] = {}  # turn_index_gap: sessions, empty_generation: turns (after pass 2)
        self.warning_examples: dict[str, str] = {}
        for number, info in enumerate(self._infos):
            self._index_file(number, info)
        self.session_count = len(self._spans)
        self._items = self._generate()

    def __next__(self) -> Session | QuarantineEntry:
        return next(self._items)

    def close(self) -> None:
        """Stop reading: the file being read and the thread reading ahead in it go now, not
        whenever the garbage collector finds the stream (which refers to itself)."""
        self._items.close()

    @property
    def unattributed(self) -> list[QuarantineEntry]:
        """Entries for rows that belong to no session (known from pass 1)."""
        return list(self._unattributed)

    @property
    def file_metas(self) -> list[DumpMeta]:
        """Each file's recording metadata (options applied), in file order."""
        return list(self._file_meta)

    def position(self, session_id: str) -> int:
        """Input order of a session (by its first row); sorts `load`'s output."""
        return self._spans[session_id].order

    def recordings(self) -> dict[tuple[str | None, str | None], str]:
        """Each distinct (tokenizer, chat_template) the files record, overrides applied, with the first
        file's label: what must resolve before any session is rendered."""
        found: dict[tuple[str | None, str | None], str] = {}
        for info, meta in zip(self._infos, self._file_meta):
            found.setdefault((meta.tokenizer, meta.chat_template), info.label)
        return found

    # -- setup ---------------------------------------------------------------------------------
    @staticmethod
    def _inspect(path: Location, root: Location) -> _FileInfo:
        schema, groups = read_file_schema(path)
        if path == root:
            label = storage.name(path)
        else:
            label = path.relative_to(root).as_posix() if isinstance(path, Path) else path[len(str(root)) + 1 :]
        columns = [column.name for column in COLUMNS if column.name in schema.names]
        rows = sum(count for count, _ in groups)
        return _FileInfo(
            path, label, rows, pieces(groups), columns, check_schema(schema), trace_tools_keys(schema), groups
        )

    def _init_meta(self, **overrides: str | None) -> None:
        for info in self._infos:
            check_schema_version(info.label, info.keys)
        keys, self.warnings = merge_keys([(info.label, info.keys) for info in self._infos])
        self.meta = merged_dump_meta(keys, overrides)

    def _index_file(self, number: int, info: _FileInfo) -> None:
        """Pass 1 for one file: record each session's first/last row and the file's schema problems."""
        if "session_id" not in info.columns:
            self._unattributed.append(
                QuarantineEntry(
                    None,
                    None,
                    "missing_column",
                    f"{info.label}: required column session_id is missing; its {info.rows} rows belong to no session",
                )
            )
            return
        seen_here: dict[str, None] = {}
        # null / empty / oversized session_id
        orphans: dict[str, list[int]] = {"missing_column": [], "bad_message": [], "cell_too_large": []}
        row = 0
        for batch in iter_batches(info.path, ["session_id"], INDEX_BATCH_ROWS):
            oversized, start = oversized_rows(batch.column(0), self._cell_limit), row
            for value in text_values(null_rows(batch.column(0), oversized)):
                session_id = session_key(value)
                if row - start in oversized:
                    orphans["cell_too_large"].append(row)
                elif session_id is None:
                    orphans["missing_column" if value is None else "bad_message"].append(row)
                else:
                    self._note_row(session_id, number, row, seen_here)
                    if isinstance(value, BadText) and not self._spans[session_id].problems:
                        self._spans[session_id].problems.append(
                            QuarantineEntry(
                                session_id, None, "bad_text", f"{info.label} row {row}: session_id is not valid UTF-8"
                            )
                        )
                row += 1
        self._note_file_problems(info, seen_here)
        for reason, rows in orphans.items():
            if rows:
                shown = ", ".join(map(str, rows[:5])) + (", …" if len(rows) > 5 else "")
                what = {"missing_column": "null", "bad_message": "empty"}.get(reason, "oversized")
                self._unattributed.append(
                    QuarantineEntry(
                        None, None, reason, f"{info.label}: {what} session_id in {len(rows)} rows (rows {shown})"
                    )
                )

    def _note_row(self, session_id: str, number: int, row: int, seen_here: dict[str, None]) -> None:
        span = self._spans.get(session_id)
        if span is None:
            self._spans[session_id] = _Span(len(self._spans), (number, row), number, row)
        else:
            span.last = (number, row)
            span.rows += 1
        seen_here[session_id] = None

    def _note_file_problems(self, info: _FileInfo, session_ids: dict[str, None]) -> None:
        """A missing or mistyped column in a file condemns every session with rows in it."""
        for _column, reason, detail in info.problems:
            for session_id in session_ids:
                entry = QuarantineEntry(session_id, None, reason, f"{info.label}: {detail}")
                self._spans[session_id].problems.append(entry)

    # -- pass 2 --------------------------------------------------------------------------------
    def _generate(self) -> Generator[Session | QuarantineEntry, None, None]:
        yield from self._unattributed
        for _position, item in self.positioned():
            if isinstance(item, Session):
                yield item
            else:
                yield from item

    def positioned(self) -> Iterator[tuple[int, Session | list[QuarantineEntry]]]:
        """Pass 2, without the unattributed entries: each session with its position in finishing
        order (0, 1, …; the positions `slots` gives), as a `Session` or its quarantine entries."""
        endings: list[list[tuple[int, str]]] = [[] for _ in self._infos]
        for session_id, span in self._spans.items():
            endings[span.last[0]].append((span.last[1], session_id))
        buffers: dict[str, list[Turn]] = {}
        position = 0
        for number, info in enumerate(self._infos):
            due = sorted(endings[number], reverse=True)  # pop() from the end = lowest last row first
            endings[number] = []
            for rows_read in self._read_rows(number, info, buffers):
                while due and due[-1][0] < rows_read:
                    yield position, self._finish(due.pop()[1], buffers)
                    position += 1
            while due:
                yield position, self._finish(due.pop()[1], buffers)
                position += 1

    def slots(self) -> Iterator[SessionSlot]:
        """Every session in finishing order, with where its rows are (pass 1 only; reads nothing)."""
        ordered = sorted(self._spans.items(), key=lambda item: item[1].last)
        for position, (session_id, span) in enumerate(ordered):
            groups = [] if span.problems else self._groups_of(span)
            yield SessionSlot(position, session_id, span.first_file, groups, list(span.problems), span.rows)

    def _groups_of(self, span: _Span) -> list[tuple[int, int]]:
        """The pieces between a session's first and last row, in readable files: found by bisection
        of the pieces' first rows, so planning costs the pieces a session spans, not the file's."""
        found: list[tuple[int, int]] = []
        for number in range(span.first_file, span.last[0] + 1):
            info = self._infos[number]
            if info.problems or "session_id" not in info.columns or not info.pieces:
                continue
            low = span.first_row if number == span.first_file else 0
            high = span.last[1] if number == span.last[0] else info.rows - 1
            starts = self._piece_starts[number]
            first, last = bisect_right(starts, low) - 1, bisect_right(starts, high) - 1
            found.extend((number, piece) for piece in range(max(first, 0), last + 1))
        return found

    def context(self) -> DumpContext:
        """What workers need to read sessions from their `SessionSlot`s (`read_session`)."""
        return DumpContext(
            [storage.absolute(info.path) for info in self._infos],
            [info.label for info in self._infos],
            [[c for c in info.columns if self._wanted is None or c in self._wanted] for info in self._infos],
            list(self._file_vocab),
            list(self._file_meta),
            [list(info.pieces) for info in self._infos],
            self._cell_limit,
        )

    def _read_rows(self, number: int, info: _FileInfo, buffers: dict[str, list[Turn]]) -> Iterator[int]:
        """Feed one file's rows into the session buffers; yields the number of rows read after each batch.

        A file with schema problems is not read: all its sessions are already condemned.
        """
        if info.problems or "session_id" not in info.columns:
            return
        vocab = self._file_vocab[number]
        row = 0
        # The next batch is decoded and checked (Arrow's code, the GIL released) while this one
        # becomes rows and turns.
        for batch, checked, oversized in read_ahead(self._checked_batches(info, vocab)):
            for index, record in enumerate(batch_records(batch, checked, self._id_arrays)):
                self._take_row(record, f"{info.label} row {row}", buffers, vocab, checked, oversized.get(index))
                row += 1
            yield row

    def _checked_batches(
        self, info: _FileInfo, vocab: int | None
    ) -> Iterator[tuple[pa.RecordBatch, frozenset[str], dict[int, str]]]:
        """The file's record batches with oversized cells nulled, timestamps in UTC, the token-id
        columns found in range, and what was too large per row."""
        columns = [c for c in info.columns if self._wanted is None or c in self._wanted]
        for batch in iter_batches(info.path, columns, batch_rows_within(info.groups, ROW_BATCH_ROWS)):
            batch, oversized = without_oversized(batch, self._cell_limit)
            yield utc_batch(batch), batch_ids_ok(batch, vocab), oversized

    def _take_row(
        self,
        record: dict[str, Any],
        where: str,
        buffers: dict[str, list[Turn]],
        vocab_size: int | None,
        ids_checked: frozenset[str] = frozenset(),
        oversized: str | None = None,
    ) -> None:
        session_id = session_key(record["session_id"])
        if session_id is None:
            return  # reported per file by pass 1
        span = self._spans[session_id]
        if span.problems:
            return
        parser = self._parsers.get(session_id)
        if parser is None:
            parser = self._parsers[session_id] = HistoryParser()
        item = row_turn(record, where, session_id, vocab_size, parser, ids_checked, oversized)
        if isinstance(item, QuarantineEntry):
            span.problems.append(item)
            buffers.pop(session_id, None)
        else:
            buffers.setdefault(session_id, []).append(item)

    def _finish(self, session_id: str, buffers: dict[str, list[Turn]]) -> Session | list[QuarantineEntry]:
        """The session's last row has been read: the session, or its quarantine entries."""
        span = self._spans[session_id]
        turns = buffers.pop(session_id, [])
        self._parsers.pop(session_id, None)
        if span.problems:
            problems, span.problems = span.problems, []  # the session is done; release its entries
            return problems
        item = finished_session(session_id, turns, self._file_meta[span.first_file])
        if isinstance(item, Session):
            for kind, (count, example) in session_warnings(item).items():
                self.data_warnings[kind] = self.data_warnings.get(kind, 0) + count
                self.warning_examples.setdefault(kind, example)
        return item

    def unusable_reason(self) -> str | None:
        """Why no session of the dump can be used (no rows, no session ids, a schema problem in every
        file), as a sentence naming the fix; None when some session may be valid."""
        if self.rows == 0:
            return "it has no rows; export at least one session"
        with_rows = [info for info in self._infos if info.rows]
        broken = [info for info in with_rows if info.problems or "session_id" not in info.columns]
        if broken and len(broken) == len(with_rows):
            column, reason, detail = (
                broken[0].problems[0] if broken[0].problems else ("session_id", "missing_column", "")
            )
            detail = detail or "required column session_id is missing"
            where = broken[0].label if len(broken) == 1 else f"{broken[0].label} and {len(broken) - 1} other file(s)"
            fix = "add it" if reason == "missing_column" else f"write it as {expected_type(COLUMNS_BY_NAME[column])}"
            return f"{detail} ({where}), so no session can be read; {fix} (trace schema v1) and re-export the dump"
        if not self._spans:
            return "no row has a session_id; fill the session_id column"
        return None


ROW_COLUMN = "__row__"  # added by `read_row_group`: each row's number in its file


def read_row_group(context: DumpContext, number: int, piece: int, session_ids: list[str]) -> list[pa.Table]:
    """Piece `piece` of file `number` (a row group, or a row range of one: `pieces`), split into
    the rows of each of `session_ids` (in that order), each row with its number in the file
    (`ROW_COLUMN`). Runs on a worker: decoding a row group is most of reading it, so each is
    decoded once for all the sessions it holds."""
    import numpy as np

    path = context.files[number]
    group, start, rows = context.pieces[number][piece]
    table = read_piece(path, context.columns[number], group, start - group_start(context.pieces[number], piece), rows)
    # From a range, not a numpy array: converting an array imports numpy.ma (16 ms) in each worker.
    table = table.append_column(ROW_COLUMN, pa.array(range(start, start + table.num_rows), pa.int64()))
    # Rows are told apart by the keys pass 1 gave them (`session_key`), not by `pyarrow.compute`:
    # importing it cost each worker 30 ms.
    wanted: dict[str | None, int] = {session_id: code for code, session_id in enumerate(session_ids)}
    ids = table.column("session_id").combine_chunks()
    keys = text_values(null_rows(ids, oversized_rows(ids, context.cell_limit or max_cell_bytes())))
    codes = np.array([wanted.get(session_key(value), -1) for value in keys], dtype=np.int64)
    order = np.argsort(codes, kind="stable")  # rows grouped by session, file order kept within each
    bounds = np.searchsorted(codes[order], np.arange(len(session_ids) + 1))
    return [_rows_at(table, order[bounds[i] : bounds[i + 1]]) for i in range(len(session_ids))]


def _rows_at(table: pa.Table, rows: Any) -> pa.Table:
    """`table.take(rows)`; a slice, which copies nothing, where the rows are consecutive (a
    session's rows usually are): the copy was a tenth of a worker's time reading sessions."""
    if len(rows) and rows[-1] - rows[0] == len(rows) - 1:  # ascending (a stable sort of one code)
        return table.slice(int(rows[0]), len(rows))
    return table.take(rows)


def read_session(
    context: DumpContext, slot: SessionSlot, parts: list[pa.Table], id_arrays: bool = False
) -> Session | list[QuarantineEntry]:
    """A session from its rows as `read_row_group` split them (one table per `slot.row_groups`),
    checked exactly as the stream checks them (same entries, same details). `id_arrays`: token ids
    in range as int32 arrays, not lists (`batch_records`), for a caller that reads them as such."""
    parser = HistoryParser()
    turns: list[Turn] = []
    for (number, _group), part in zip(slot.row_groups, parts):
        if not part.num_rows:
            continue
        rows = part.column(ROW_COLUMN).to_pylist()
        batch = part.drop_columns([ROW_COLUMN]).combine_chunks().to_batches()[0]
        batch, oversized = without_oversized(batch, context.cell_limit or max_cell_bytes())
        vocab = context.vocab[number]
        checked = batch_ids_ok(batch, vocab)
        for index, (row, record) in enumerate(zip(rows, batch_records(utc_batch(batch), checked, id_arrays))):
            where = f"{context.labels[number]} row {row}"
            item = row_turn(record, where, slot.session_id, vocab, parser, checked, oversized.get(index))
            if isinstance(item, QuarantineEntry):
                return [item]
            turns.append(item)
    return finished_session(slot.session_id, turns, context.metas[slot.first_file])


def iter_sessions(
    path: Location,
    *,
    tokenizer: str | None = None,
    chat_template: str | None = None,
    history_mode: str | None = None,
    harness: str | None = None,
    vocab_size: int | None = None,
    columns: Iterable[str] | None = None,
    id_arrays: bool = False,
) -> SessionStream:
    """Stream a dump: yields each valid `Session` and each `QuarantineEntry` (see `SessionStream`).

    Keyword options override the dump's `trace_tools.*` metadata (as command-line options do).
    Raises `UnusableInput` for a path that is not a readable dump.
    """
    return SessionStream(
        path,
        tokenizer=tokenizer,
        chat_template=chat_template,
        history_mode=history_mode,
        harness=harness,
        vocab_size=vocab_size,
        columns=columns,
        id_arrays=id_arrays,
    )


def load(
    path: Location,
    *,
    tokenizer: str | None = None,
    chat_template: str | None = None,
    history_mode: str | None = None,
    harness: str | None = None,
    vocab_size: int | None = None,
) -> LoadedDump:
    """Load a whole dump: valid sessions and quarantine entries, both in input order (first row).

    The keyword options override the dump's metadata; `vocab_size` overrides the tokenizer's
    vocabulary size for the out-of-vocab check. Raises `UnusableInput` for unusable input.
    """
    stream = iter_sessions(
        path,
        tokenizer=tokenizer,
        chat_template=chat_template,
        history_mode=history_mode,
        harness=harness,
        vocab_size=vocab_size,
    )
    sessions: list[Session] = []
    quarantine: list[QuarantineEntry] = []
    for item in stream:
        if isinstance(item, Session):
            sessions.append(item)
        else:
            quarantine.append(item)
    sessions.sort(key=lambda session: stream.position(session.session_id))
    quarantine.sort(key=lambda e: -1 if e.session_id is None else stream.position(e.session_id))
    return LoadedDump(
        sessions,
        quarantine,
        stream.meta,
        stream.files,
        stream.rows,
        stream.vocab_checked,
        vocab_size=stream.vocab_size,
        session_count=stream.session_count,
        warnings=stream.warnings,
        data_warnings=dict(stream.data_warnings),
    )
