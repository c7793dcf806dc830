"""Atomic writers and the two tables io produces: quarantine lists and schema-v1 dumps.

Every writer puts the bytes in a temporary file in the destination's directory and then
`os.replace`s it onto the destination, so a reader (or a resumed run, docs/run_directory.md#layout) sees either
the old file or the complete new one, never a torn write. The temporary name starts with a dot
and ends in `.tmp`, so a directory scan for `*.parquet` never picks up a half-written file. The
file gets the permissions a plain `open` would give (0644 under umask 022), not mkstemp's 0600.
"""

from __future__ import annotations

import errno
import json
import marshal
import math
import os
import tempfile
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import IO, Any, Callable, Iterable, Iterator

import pyarrow as pa
import pyarrow.parquet as pq

from trace_tools.data import DumpMeta, QuarantineEntry, Session, Turn
from trace_tools.errors import OutputFailed
from trace_tools.io import cache
from trace_tools.io.schema import ARROW_SCHEMA, JSON_COLUMNS, META_FIELDS, META_PREFIX, SCHEMA_VERSION

QUARANTINE_SCHEMA = pa.schema(
    [
        pa.field("session_id", pa.string()),
        pa.field("turn_index", pa.int32()),
        pa.field("reason", pa.string()),
        pa.field("detail", pa.string()),
    ]
)


_NO_ROOM = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS)


@contextmanager
def writing(path: Path) -> Iterator[None]:
    """Turn a write that fails for want of room (a full disk or quota, a file-size limit, a
    read-only file system) into `OutputFailed` naming `path`; other errors pass unchanged."""
    try:
        yield
    except OSError as error:
        if error.errno not in _NO_ROOM and "No space left on device" not in str(error):
            raise
        reason = error.strerror or (str(error).strip().splitlines() or ["write failed"])[0]
        raise OutputFailed(
            f"cannot write {path} ({reason}); free some space or write somewhere else (its temporary file was removed)"
        ) from None


@contextmanager
def atomic_open(path: str | Path, mode: str, *, exclusive: bool = False) -> Iterator[IO]:
    """Open a temp file next to `path`; on success fsync and rename it onto `path`, else delete it.

    `exclusive` never replaces an existing `path`: the complete file is hard-linked into place
    (FileExistsError when `path` exists) and the temporary name removed."""
    target = Path(path)
    with writing(target):
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, temp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
        try:
            os.fchmod(fd, plain_file_mode())
            with os.fdopen(fd, mode, encoding=None if "b" in mode else "utf-8") as handle:
                yield handle
                handle.flush()
                os.fsync(handle.fileno())
            if exclusive:
                os.link(temp, target)
                os.unlink(temp)
            else:
                os.replace(temp, target)
        except BaseException:
            Path(temp).unlink(missing_ok=True)
            raise


def read_cached(path: Path | None, key: str, default: Any) -> Any:
    """`key` of the JSON object cached at `path`; `default` when there is none or it is unreadable."""
    if path is None:
        return default
    try:
        return json.loads(path.read_text())[key]
    except (OSError, ValueError, TypeError, KeyError):
        return default


def write_cached(path: Path | None, key: str, value: Any) -> None:
    """Cache `{key: value}` at `path`, atomically (worker processes race to write it); a read-only
    cache only costs computing the value again."""

    def write(target: Path) -> None:
        with atomic_open(target, "w") as out:
            json.dump({key: value}, out)

    if path is not None:
        cache.store(path, write)


def marshalled(target: Path, expected: type, compute: Callable[[], Any]) -> Any:
    """The value kept at `target` (a cache path, `CacheKey.path`) as marshal data when it is an
    `expected`; otherwise `compute()`, kept there for the next process (atomically: worker
    processes race to write it; a cache that cannot hold it only costs computing again).
    Marshal's format is the Python version's, so the key of `target` names `"python"` among its
    libraries."""
    try:
        kept = marshal.loads(target.read_bytes())
        if isinstance(kept, expected):
            return kept
    except (OSError, ValueError, EOFError, TypeError):  # absent, or not marshal data
        pass
    value = compute()

    def write(path: Path) -> None:
        with atomic_open(path, "wb") as out:
            out.write(marshal.dumps(value))

    cache.store(target, write)
    return value


def plain_file_mode() -> int:
    """The permissions a plain `open` gives a new file: 0o666 less the process umask (reading the
    umask means setting it, so it is set straight back)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return 0o666 & ~mask


def write_parquet_atomic(
    table_or_df: Any,
    path: str | Path,
    metadata: dict[str, str] | None = None,
    *,
    exclusive: bool = False,
    dump: bool = False,
) -> Path:
    """Write a pyarrow Table (or pandas DataFrame, index dropped) as Parquet, atomically
    (`exclusive`: never over an existing file, `atomic_open`). `dump`: a trace dump, in the row
    groups loaders read in parallel (`write_row_groups`); otherwise pyarrow's.

    `metadata` is added to the file's key-value metadata (keeping what the table already has),
    e.g. `{"trace_tools.tokenizer": "qwen3"}`.
    """
    table = table_or_df
    if not isinstance(table, pa.Table):
        table = pa.Table.from_pandas(table_or_df, preserve_index=False)
    if metadata:
        merged = dict(table.schema.metadata or {})
        merged.update({str(k).encode(): str(v).encode() for k, v in metadata.items()})
        table = table.replace_schema_metadata(merged)
    with atomic_open(path, "wb", exclusive=exclusive) as handle:
        if not dump:
            pq.write_table(table, handle)
        else:
            with pq.ParquetWriter(handle, table.schema) as writer:
                write_row_groups(writer, table)
    return Path(path)


# Row groups of the dumps trace-tools writes (`simulate`, `import`): a row group is what one Ray
# loader task decodes, so a group closes at DUMP_ROW_GROUP_ROWS rows or DUMP_ROW_GROUP_BYTES of
# Arrow data, whichever comes first: a dump of N rows gives about N / 256 tasks to share out, and
# no task decodes more than a few MB (docs/scale.md#row-groups).
DUMP_ROW_GROUP_ROWS = 256
DUMP_ROW_GROUP_BYTES = 4 * 2**20


def write_row_groups(writer: pq.ParquetWriter, table: pa.Table, rows: int = DUMP_ROW_GROUP_ROWS) -> None:
    """`table` as row groups of at most `rows` rows and about DUMP_ROW_GROUP_BYTES each."""
    if table.num_rows:
        by_bytes = math.floor(table.num_rows * DUMP_ROW_GROUP_BYTES / max(table.nbytes, 1))
        writer.write_table(table, row_group_size=max(1, min(rows, by_bytes)))


def _plain(value: Any) -> Any:
    """JSON-safe copy: NaN/±inf become null, numpy scalars and arrays become Python values."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k) if not isinstance(k, str) else k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if hasattr(value, "tolist") and callable(value.tolist):  # numpy scalar or array
        return _plain(value.tolist())
    return value


def _fallback(value: Any) -> Any:
    """What json.dumps cannot encode by itself: datetimes (ISO 8601), paths, sets."""
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, (set, frozenset)):
        return _plain(sorted(value, key=repr))
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def write_json_atomic(obj: Any, path: str | Path) -> Path:
    """Write `obj` as indented JSON (key order kept, NaN and infinities written as null), atomically."""
    text = json.dumps(_plain(obj), indent=2, sort_keys=False, allow_nan=False, ensure_ascii=False, default=_fallback)
    return write_text_atomic(text + "\n", path)


def write_text_atomic(text: str, path: str | Path) -> Path:
    """Write UTF-8 text, atomically."""
    with atomic_open(path, "w") as handle:
        handle.write(text)
    return Path(path)


def quarantine_table(entries: Iterable[QuarantineEntry]) -> pa.Table:
    """The quarantine list as a table with the `quarantine.parquet` columns of
    docs/run_directory.md#what-the-files-hold."""
    entries = list(entries)
    return pa.table(
        {
            "session_id": [e.session_id for e in entries],
            "turn_index": [e.turn_index for e in entries],
            "reason": [e.reason for e in entries],
            "detail": [e.detail for e in entries],
        },
        schema=QUARANTINE_SCHEMA,
    )


def meta_to_metadata(meta: DumpMeta) -> dict[str, str]:
    """DumpMeta as `trace_tools.*` key-value metadata (unset fields omitted)."""
    keys = {name: getattr(meta, name) for name in META_FIELDS}
    keys.update(meta.extra)
    return {f"{META_PREFIX}{name}": value for name, value in keys.items() if value is not None}


def _json_text(value: Any) -> str | None:
    return None if value is None else json.dumps(value, ensure_ascii=False)


def _utc(moment: datetime | None) -> datetime | None:
    """Naive datetimes are UTC by the schema's convention."""
    return moment.replace(tzinfo=timezone.utc) if moment is not None and moment.tzinfo is None else moment


def turn_row(turn: Turn) -> dict[str, Any]:
    """One turn as a schema-v1 row: JSON columns serialized, timestamps in UTC."""
    row = {name: getattr(turn, name) for name in ARROW_SCHEMA.names}
    row.update({name: _json_text(row[name]) for name in JSON_COLUMNS})
    row["started_at"], row["finished_at"] = _utc(turn.started_at), _utc(turn.finished_at)
    return row


def sessions_to_table(sessions: Iterable[Session], meta: DumpMeta | None = None) -> pa.Table:
    """Sessions as a schema-v1 table with canonical types, one row per turn in session order.

    JSON columns are serialized with `json.dumps(ensure_ascii=False)`. The schema carries
    `trace_tools.*` metadata from `meta` (default: the first session's), so
    `write_parquet_atomic(sessions_to_table(...), path)` writes a self-describing dump.
    """
    sessions = list(sessions)
    if meta is None:
        meta = sessions[0].meta if sessions else DumpMeta()
    rows = [turn_row(turn) for session in sessions for turn in session.turns]
    return pa.Table.from_pylist(rows, schema=dump_schema(meta))


def dump_schema(meta: DumpMeta) -> pa.Schema:
    """The schema-v1 Arrow schema carrying `meta` (and the schema version) as `trace_tools.*` metadata."""
    metadata = {f"{META_PREFIX}schema_version": SCHEMA_VERSION, **meta_to_metadata(meta)}
    return ARROW_SCHEMA.with_metadata({k.encode(): v.encode() for k, v in metadata.items()})


class DumpWriter:
    """Appends turns to a schema-v1 Parquet file one row group at a time, so memory holds one group.

    Use `dump_writer(path, meta)`: the file appears (atomically) only when the block exits
    cleanly. File metadata is fixed when the writer opens (readers take `trace_tools.*` keys from
    the Arrow schema, which Parquet stores up front), so `meta` must be complete by then.
    """

    def __init__(self, handle: IO, meta: DumpMeta, row_group_rows: int):
        self._schema = dump_schema(meta)
        self._writer = pq.ParquetWriter(handle, self._schema)
        self._pending: list[dict[str, Any]] = []
        self._group = row_group_rows
        self.rows = 0

    def write(self, turn: Turn) -> None:
        self._pending.append(turn_row(turn))
        self.rows += 1
        if len(self._pending) >= self._group:
            self.flush()

    def flush(self) -> None:
        if self._pending:
            write_row_groups(self._writer, pa.Table.from_pylist(self._pending, schema=self._schema), self._group)
            self._pending = []

    def close(self) -> None:
        self.flush()
        self._writer.close()


@contextmanager
def dump_writer(path: str | Path, meta: DumpMeta, *, row_group_rows: int = DUMP_ROW_GROUP_ROWS) -> Iterator[DumpWriter]:
    """A `DumpWriter` onto `path`; the complete file replaces `path` when the block exits cleanly."""
    with atomic_open(path, "wb") as handle:
        writer = DumpWriter(handle, meta, row_group_rows)
        yield writer
        writer.close()
