"""A dump's files and metadata: the Parquet files of a path or URI, their schemas, their
`trace_tools.*` metadata merged into one `DumpMeta`, and record batches read from them (`io.load`
reads sessions through these)."""

from __future__ import annotations

import dataclasses
import math
import os
import threading
from collections import Counter
from itertools import accumulate
from pathlib import Path
from typing import Any, Iterator

import pyarrow as pa
import pyarrow.parquet as pq

from trace_tools.data import DumpMeta
from trace_tools.errors import UnusableInput
from trace_tools.io import storage
from trace_tools.io.rows import (
    short,
)
from trace_tools.io.rundir import directory_kind, not_a_dump
from trace_tools.io.schema import (
    META_FIELDS,
    META_PREFIX,
    SUPPORTED_SCHEMA_VERSIONS,
)
from trace_tools.io.storage import Location
from trace_tools.io.vocab import vocab_size_for
from trace_tools.io.write import DUMP_ROW_GROUP_ROWS


def find_files(path: Location) -> list[Location]:
    """The Parquet files of a dump (a local path or a URI, `io.storage`): the file itself, or every
    `*.parquet` under a directory, sorted.

    Local directories that trace-tools writes (a replay run, a rescore output) are outputs, never
    input: one inside a dump directory is passed over, and pointing at one is an error that says so."""

    root = storage.location(path)
    if storage.is_file(root):
        kind = directory_kind(root.parent) if isinstance(root, Path) else None
        if kind is not None and isinstance(root, Path):
            raise UnusableInput(not_a_dump(root, root.parent, kind))
        return [root]
    if not storage.exists(root):
        raise UnusableInput(f"no such file or directory: {path}; pass a Parquet file or a directory of them")
    if not storage.is_dir(root):
        raise UnusableInput(f"{path} is neither a file nor a directory; pass a Parquet file or a directory of them")
    if isinstance(root, Path):
        kind = directory_kind(root)
        if kind is not None:
            raise UnusableInput(not_a_dump(root, root, kind))
        files: list[Location] = sorted(_parquet_files(root))
    else:
        files = storage.list_files(root, ".parquet")
    if not files:
        raise UnusableInput(f"no .parquet files under {path}; pass a Parquet file or a directory of them")
    return files


def _parquet_files(root: Path) -> Iterator[Path]:
    """`*.parquet` files under a local `root`, passing over the directories trace-tools writes."""

    for folder, subfolders, names in os.walk(root, followlinks=True):
        subfolders[:] = [name for name in subfolders if directory_kind(Path(folder) / name) is None]
        yield from (path for name in names if name.endswith(".parquet") and (path := Path(folder) / name).is_file())


def unreadable_file(path: Location, error: Exception) -> UnusableInput:
    reason = (str(error).strip().splitlines() or [type(error).__name__])[0]
    return UnusableInput(f"{path} is not a readable Parquet file ({reason}); re-export it or remove it from the dump")


def read_file_schema(path: Location) -> tuple[pa.Schema, list[tuple[int, int]]]:
    """A file's Arrow schema and each row group's (rows, uncompressed bytes), from its footer only."""
    try:
        with storage.open_input(path) as handle:
            parquet = _parquet_file(path, handle)
            groups = [parquet.metadata.row_group(i) for i in range(parquet.metadata.num_row_groups)]
            return parquet.schema_arrow, [(group.num_rows, group.total_byte_size) for group in groups]
    except (pa.ArrowException, OSError, ValueError) as error:
        raise unreadable_file(path, error) from None


STREAM_BUFFER_BYTES = 2**20
# A record batch's decoded size, at most: below jemalloc's 8 MiB `oversize_threshold`. Batches of
# 10 MiB columns took 80,000 page faults a read of the benchmark's dump, 4 MiB ones a tenth or fewer
# (docs/performance.md#arrows-allocator).
STREAM_BATCH_BYTES = 4 * 2**20


def batch_rows_within(groups: list[tuple[int, int]], most: int, limit: int = STREAM_BATCH_BYTES) -> int:
    """Rows per record batch of a file whose row groups have these (rows, uncompressed bytes):
    as many as fit in `limit` bytes at the file's mean row size, between 1 and `most`."""
    rows, size = sum(count for count, _ in groups), sum(nbytes for _, nbytes in groups)
    return max(1, min(most, limit * rows // size)) if rows and size else most


def iter_batches(
    path: Location, columns: list[str], batch_rows: int, row_groups: list[int] | None = None
) -> Iterator[pa.RecordBatch]:
    """Record batches of `columns`, turning a corrupt page found mid-file into UnusableInput.

    Memory stays flat in the file's size: each column chunk is read through a buffer of
    STREAM_BUFFER_BYTES, page by page, rather than whole (by default Arrow reads a row group's
    column chunks whole, so one large row group costs its size), and the columns are decoded
    one after another, not by threads that each hold a batch's worth at once."""
    try:
        with storage.open_input(path) as handle:
            parquet = _parquet_file(path, handle, buffer_size=STREAM_BUFFER_BYTES, pre_buffer=False)
            yield from parquet.iter_batches(batch_rows, row_groups, columns, use_threads=False)
    except (pa.ArrowException, OSError, ValueError) as error:
        raise unreadable_file(path, error) from None


def trace_tools_keys(schema: pa.Schema) -> dict[str, str]:
    """The file's `trace_tools.*` key-value metadata, prefix stripped."""
    found = {}
    for key, value in (schema.metadata or {}).items():
        key = key.decode("utf-8", "replace")
        if key.startswith(META_PREFIX):
            found[key[len(META_PREFIX) :]] = value.decode("utf-8", "replace")
    return found


def merge_keys(per_file: list[tuple[str, dict[str, str]]]) -> tuple[dict[str, str], list[str]]:
    """Merge files' metadata for dump-level reporting (the first file that sets a key wins); one
    note per disputed key. Sessions keep their own file's metadata (see `SessionStream`)."""
    merged: dict[str, str] = {}
    source: dict[str, str] = {}
    warnings: dict[str, str] = {}
    for label, keys in per_file:
        for key, value in keys.items():
            if key not in merged:
                merged[key], source[key] = value, label
            elif merged[key] != value and key not in warnings:
                warnings[key] = (
                    f"files disagree on {META_PREFIX}{key}: {source[key]} has {short(merged[key])}, "
                    f"{label} has {short(value)}; each session keeps its own file's value "
                    f"(dump-level summaries show {source[key]}'s)"
                )
    return merged, list(warnings.values())


def merged_dump_meta(keys: dict[str, str], overrides: dict[str, str | None]) -> DumpMeta:
    """A DumpMeta from merged `trace_tools.*` keys, with non-None keyword overrides applied."""
    known = {name: keys.get(name) for name in META_FIELDS}
    extra = {key: value for key, value in keys.items() if key not in META_FIELDS}
    meta = DumpMeta(**known, extra=extra)
    # Any: mypy checks `**` values against every field, `extra` included; these keys are str options.
    chosen: dict[str, Any] = {k: v for k, v in overrides.items() if v is not None}
    return dataclasses.replace(meta, **chosen)


def check_schema_version(label: str, keys: dict[str, str]) -> None:
    """A file that declares a schema version this trace-tools does not read is refused, not guessed at."""
    version = keys.get("schema_version")
    if version is not None and version not in SUPPORTED_SCHEMA_VERSIONS:
        raise UnusableInput(
            f"{label} declares trace_tools.schema_version {version!r}; this trace-tools reads schema version "
            f"{', '.join(SUPPORTED_SCHEMA_VERSIONS)}: convert the dump, or read it with the trace-tools that wrote it"
        )


def read_dump_meta(path: Location) -> DumpMeta:
    """The dump's `trace_tools.*` metadata from the file footers alone (first file wins on conflicts)."""
    files = find_files(path)
    keys, _ = merge_keys([(str(f), trace_tools_keys(read_file_schema(f)[0])) for f in files])
    return merged_dump_meta(keys, {})


def vocab_bound(vocab_size: int | None, tokenizer: str | None) -> int | None:
    """The out-of-vocab bound: the explicit size, else the tokenizer's full size, else None (unknown)."""
    if vocab_size is not None:
        return int(vocab_size)

    return vocab_size_for(tokenizer)


# -- what one Ray loader task reads: a row group, or a row range of a large one (a "piece"). A group
# over PIECE_ROWS rows or PIECE_BYTES (uncompressed) is read as that many equal row ranges, at
# most MAX_PIECES: each range's task streams the group from its start and keeps only its rows, so
# no task holds the group, at the cost of decoding the rows before its range again.
PIECE_ROWS = 4096
PIECE_BYTES = 16 * 2**20
MAX_PIECES = 32
# Parsed footers of local files, by (name, size, modification time): a worker reads a file's row
# groups one task at a time, and parsing the benchmark dump's footer (54 row groups, a chat
# template in its metadata) took about 1.7 ms a read. Forked workers inherit the footers the
# calling process parsed while indexing the dump.
_FOOTERS: dict[tuple[str, int, int], Any] = {}
_FOOTERS_KEPT = 64
_FOOTERS_LOCK = threading.Lock()  # the reading-ahead thread and the main thread both open files


def _parquet_file(path: Location, handle: Any, **options: Any) -> pq.ParquetFile:
    """`handle` opened as Parquet, its footer parsed once per version of a local file."""
    key = _version(path, handle)
    parquet = pq.ParquetFile(handle, metadata=_FOOTERS.get(key) if key else None, **options)
    if key and key not in _FOOTERS:
        with _FOOTERS_LOCK:
            while len(_FOOTERS) >= _FOOTERS_KEPT:
                del _FOOTERS[next(iter(_FOOTERS))]  # the oldest
            _FOOTERS[key] = parquet.metadata
    return parquet


def _version(path: Location, handle: Any) -> tuple[str, int, int] | None:
    """(name, size, modification time) of the local file `handle` opened (read from the handle,
    not the path, so it is the version being read); None for a remote one."""
    if not isinstance(storage.location(path), Path):
        return None
    status = os.fstat(handle.fileno())
    return str(path), status.st_size, status.st_mtime_ns


PIECE_BATCH_ROWS = 128  # rows of a range read at a time (rows can carry 100k-token prompts)


def pieces(groups: list[tuple[int, int]]) -> list[tuple[int, int, int]]:
    """What loader tasks read of a file whose row groups have these (rows, bytes): each group, or
    equal row ranges of a large one (`PIECE_ROWS`): (row group, first row in the file, rows)."""
    found: list[tuple[int, int, int]] = []
    for group, ((rows, size), start) in enumerate(zip(groups, accumulate([0] + [r for r, _ in groups]))):
        count = min(MAX_PIECES, max(1, math.ceil(rows / PIECE_ROWS), math.ceil(size / PIECE_BYTES)))
        bounds = [rows * i // count for i in range(count + 1)]
        found.extend((group, start + low, high - low) for low, high in zip(bounds, bounds[1:]) if high > low)
    return found


def split_warning(label: str, file_pieces: list[tuple[int, int, int]]) -> str:
    """One line for a file with a row group too large for one task (read as row ranges), naming the fix."""
    groups = Counter(group for group, _, _ in file_pieces)
    large = [group for group, count in groups.items() if count > 1]
    if not large:
        return ""
    rows = sum(count for group, _, count in file_pieces if group == large[0])
    return (
        f"{label}: row group {large[0]} holds {rows} rows, read by {groups[large[0]]} tasks that each decode it up to "
        f"their rows ({len(large)} such group(s)); rewrite it in groups of {DUMP_ROW_GROUP_ROWS} rows to read it "
        f"faster: python -c \"import pyarrow.parquet as pq; pq.write_table(pq.read_table('IN.parquet'), "
        f"'OUT.parquet', row_group_size={DUMP_ROW_GROUP_ROWS})\""
    )


def group_start(file_pieces: list[tuple[int, int, int]], piece: int) -> int:
    """The first row (in the file) of the row group `piece` belongs to."""
    group = file_pieces[piece][0]
    while piece > 0 and file_pieces[piece - 1][0] == group:
        piece -= 1
    return file_pieces[piece][1]


def read_piece(path: Location, columns: list[str], group: int, offset: int, rows: int) -> pa.Table:
    """Rows [offset, offset + rows) of row group `group`: the whole group at once, or for a range
    streamed batch by batch (`iter_batches`), keeping only the range and stopping after it. A
    whole group is decoded on this thread: the callers are worker processes, one per core."""
    try:
        with storage.open_input(path) as handle:
            parquet = _parquet_file(path, handle)
            if offset == 0 and rows == parquet.metadata.row_group(group).num_rows:
                return parquet.read_row_group(group, columns=columns, use_threads=False)
    except (pa.ArrowException, OSError, ValueError) as error:
        raise unreadable_file(path, error) from None
    kept, seen = [], 0
    for batch in iter_batches(path, columns, PIECE_BATCH_ROWS, [group]):
        low, high = max(offset - seen, 0), min(offset + rows - seen, batch.num_rows)
        if high > low:
            kept.append(batch.slice(low, high - low))
        seen += batch.num_rows
        if seen >= offset + rows:
            break
    return pa.Table.from_batches(kept, schema=kept[0].schema) if kept else pa.table({})
