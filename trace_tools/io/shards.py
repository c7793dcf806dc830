"""A run directory's resumable shards, and what makes reusing them safe (docs/run_directory.md#what-a-rerun-reuses).

    RUN/.lock                   held (flock) by the one process writing the run; names it
    RUN/shards/FINGERPRINT      what a resume must match (JSON): options, input files, the shard
                                format, the trace-tools version and a digest of the code that
                                computes results
    RUN/shards/SSSSSSS.*        the files of the shard whose first session is at stream position
                                SSSSSSS: <table>.parquet, samples.arrows (length-prefixed IPC
                                streams, one per session)
    RUN/shards/SSSSSSS.done     its marker, written last: the positions it covers, a digest of
                                their session ids, and every file with its size and sha256

A shard holds consecutive sessions of the stream and closes when it reaches `SHARD_ROWS` table
rows, `SHARD_BYTES` of samples or `SHARD_SECONDS` of work, so a dump of many tiny sessions makes
few files and a dump of long ones loses little to a kill. Where a shard ends is recorded in its
marker, not derived, so the merged tables never depend on the limits.

A rerun reuses a finished shard only when its marker belongs to this fingerprint and every file
it lists is there with the recorded size and checksum, and when the sessions at its positions
are the ones it recorded; anything else is replayed again (`Verdict` says why). Merging streams
shard by shard, so memory does not grow with the number of sessions.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import struct
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from itertools import chain
from pathlib import Path
from typing import Any, Iterable, Iterator

import pyarrow as pa
import pyarrow.parquet as pq

from trace_tools.errors import TraceToolsError, UsageError
from trace_tools.io import cache, remote_lock, storage
from trace_tools.io.rundir import SMALL_TABLES, SessionRows, _small_table
from trace_tools.io.write import atomic_open, plain_file_mode, write_json_atomic, write_parquet_atomic, writing

SHARD_FORMAT = 4  # 4: markers with positions, session digest and file checksums; other formats are replayed again
SHARD_ROWS = 16_384  # table rows (turn and quarantine rows, every strategy) per shard
SHARD_BYTES = 64 * 2**20  # samples (Arrow buffer bytes) per shard
SHARD_SECONDS = 120.0  # work per shard: what a kill can lose at most
COMPACT_EVERY = 256  # sessions whose small tables a shard writer joins into one
LOCK_NAME = storage.LOCK_NAME
FINGERPRINT_NAME = "FINGERPRINT"
# The modules whose code decides what a shard holds; a change to any of them is a new fingerprint.
RESULT_CODE = ("data.py", "ids.py", "memo.py", "options.py", "io", "render", "pipeline", "strategies", "replay")


# -- fingerprint --------------------------------------------------------------------------------
def code_digest() -> str:
    """sha256 of the source of the modules that compute a run's tables (`RESULT_CODE`; `io.cache`)."""
    return cache.code_digest(*RESULT_CODE)


def fingerprint(options: dict[str, Any], files: Iterable[str]) -> dict[str, Any]:
    """What a resume must match: options, each input file's path, size and modification time,
    the shard format, the trace-tools version and the code digest. `stamp` hashes them all."""
    from trace_tools import __version__

    inputs = [storage.stamp(f) for f in files]
    parts = {
        "format": SHARD_FORMAT,
        "version": __version__,
        "code": code_digest(),
        "inputs": hashlib.sha256(json.dumps(inputs).encode()).hexdigest()[:16],
        "options": json.loads(json.dumps(options, sort_keys=True, default=str)),
    }
    stamp = hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:16]
    return {"stamp": stamp, **parts}


def recorded_fingerprint(run_dir: Path) -> dict[str, Any] | None:
    """The fingerprint a run directory's shards were written under; None when it has no shards,
    `{}` when it has some in a format from before fingerprints were JSON."""
    path = run_dir / "shards" / FINGERPRINT_NAME
    if not path.is_file():
        return None
    try:
        recorded = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return recorded if isinstance(recorded, dict) else {}


def fingerprint_change(previous: dict[str, Any], current: dict[str, Any]) -> str:
    """What differs between two fingerprints, in words (`options` are named by the caller)."""
    if previous.get("format") != current["format"]:
        return "an earlier trace-tools shard format"
    if previous.get("version") != current["version"]:
        return f"trace-tools {previous.get('version')}, this is {current['version']}"
    if previous.get("code") != current["code"]:
        return "another build of trace-tools (the code that computes results changed)"
    if previous.get("inputs") != current["inputs"]:
        return "another dump, or its files changed since"
    return ""


# -- one writer per run directory ---------------------------------------------------------------
class RunLock:
    """An exclusive `flock` on RUN/.lock for as long as this process writes the run; the file names
    the holder, so a second writer can say who it is. The kernel drops the lock when the holder
    dies, so a killed run never leaves the directory locked."""

    def __init__(self, run_dir: Path):
        self.path = run_dir / LOCK_NAME
        self._fd: int | None = None

    def __enter__(self) -> "RunLock":
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def acquire(self) -> None:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 4096).decode("utf-8", "replace")
            os.close(fd)
            raise self._busy(holder) from None
        os.ftruncate(fd, 0)
        os.write(fd, json.dumps(remote_lock.this_process()).encode())
        self._fd = fd

    @classmethod
    def check_free(cls, run_dir: Path) -> None:
        """Raise the error `acquire` would, without taking the lock or creating anything."""
        lock = cls(run_dir)
        try:
            fd = os.open(lock.path, os.O_RDONLY)
        except OSError:
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            raise lock._busy(os.read(fd, 4096).decode("utf-8", "replace")) from None
        finally:
            os.close(fd)

    def _busy(self, holder: str) -> UsageError:
        return remote_lock.busy(str(self.path.parent), holder)

    def release(self) -> None:
        # The file stays: unlinking it would let a third process lock a new file while a second
        # still holds the old one.
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None


# -- markers ------------------------------------------------------------------------------------
@dataclass
class Marker:
    """A finished shard: stream positions [start, end), their session ids (the first, and a digest
    of all in order), and each of its files with its size and sha256."""

    start: int
    end: int
    first: str
    sessions: str
    files: dict[str, list[Any]]
    fingerprint: str
    format: int = SHARD_FORMAT
    render_stats: dict[str, int] = field(default_factory=dict)
    renderers: list[dict[str, Any]] = field(default_factory=list)
    data_warnings: dict[str, int] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return shard_name(self.start)

    def path(self, shards: Path, suffix: str) -> Path:
        return shards / f"{self.name}.{suffix}"


def shard_name(start: int) -> str:
    return f"{start:07d}"


def file_entry(path: Path) -> list[Any]:
    """[size in bytes, sha256] of a file."""
    with open(path, "rb") as handle:
        digest = hashlib.file_digest(handle, "sha256").hexdigest()
    return [path.stat().st_size, digest]


class IdDigest:
    """A digest of session ids in order: what a marker records of the sessions it holds."""

    def __init__(self) -> None:
        self._digest = hashlib.sha256()

    def add(self, session_id: str) -> None:
        self._digest.update(session_id.encode("utf-8", "surrogatepass") + b"\0")

    def value(self) -> str:
        return self._digest.hexdigest()[:32]


@dataclass
class Verdict:
    """What a resume found in the shards directory: the shards it may reuse and, for each one it
    may not, why (`shard 0000016: turns.parquet is truncated (…)`)."""

    reusable: list[Marker] = field(default_factory=list)
    redone: list[str] = field(default_factory=list)


def prepare(run_dir: Path, current: dict[str, Any]) -> Verdict:
    """Make RUN/shards hold only shards this run may reuse (call with the lock held): everything
    from another fingerprint goes, so does a shard whose marker or files do not check out, and so
    do files that no marker lists (a killed writer's temporaries and unfinished shards)."""
    shards = run_dir / "shards"
    recorded = recorded_fingerprint(run_dir)
    if recorded is not None and recorded.get("stamp") != current["stamp"]:
        _remove_tree(shards)
    shards.mkdir(parents=True, exist_ok=True)
    write_json_atomic(current, shards / FINGERPRINT_NAME)
    verdict = Verdict()
    kept: set[str] = {FINGERPRINT_NAME}
    covered = -1
    for done in sorted(shards.glob("*.done")):
        marker, problem = _check_marker(done, current["stamp"])
        if marker is not None and marker.start < covered:
            problem = f"its positions {marker.start}–{marker.end - 1} overlap another shard's"
        if problem:
            verdict.redone.append(f"shard {done.stem}: {problem}")
            continue
        assert marker is not None
        verdict.reusable.append(marker)
        covered = marker.end
        kept.update([done.name, *marker.files])
    for path in shards.iterdir():
        if path.name not in kept:
            path.unlink()
    for stale in run_dir.glob(".*.tmp"):
        stale.unlink()
    return verdict


def _check_marker(done: Path, stamp: str) -> tuple[Marker | None, str]:
    """The marker, or why its shard cannot be reused."""
    try:
        marker = Marker(**json.loads(done.read_text()))
    except (OSError, ValueError, TypeError) as error:
        return None, f"its marker is unreadable ({type(error).__name__})"
    if marker.fingerprint != stamp or marker.format != SHARD_FORMAT or done.stem != marker.name:
        return None, "its marker belongs to another run or shard"
    for name, (size, digest) in marker.files.items():
        path = done.parent / name
        if not path.is_file():
            return None, f"{name} is missing"
        actual_size, actual_digest = file_entry(path)
        if actual_size != size:
            return None, f"{name} has {actual_size} bytes, {size} were written"
        if actual_digest != digest:
            return None, f"{name} does not match its checksum (replaced or corrupted)"
    return marker, ""


def _remove_tree(path: Path) -> None:
    if path.exists():
        shutil.rmtree(path)


# -- writing ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Limits:
    """When a shard closes: table rows, samples bytes, seconds of work (`$TRACE_TOOLS_SHARD_*`)."""

    rows: int = SHARD_ROWS
    bytes: int = SHARD_BYTES
    seconds: float = SHARD_SECONDS

    @classmethod
    def from_env(cls) -> "Limits":
        def number(name: str, default: float) -> float:
            value = os.environ.get(f"TRACE_TOOLS_SHARD_{name}", "")
            try:
                return max(float(value), 0.0) if value else default
            except ValueError:
                raise UsageError(f"$TRACE_TOOLS_SHARD_{name} is {value!r}; set a number or unset it") from None

        return cls(int(number("ROWS", SHARD_ROWS)), int(number("BYTES", SHARD_BYTES)), number("SECONDS", SHARD_SECONDS))


class ShardWriter:
    """Collects the rows of one shard; samples go to disk session by session (each session's IPC
    stream, length-prefixed), the marker last."""

    def __init__(self, run_dir: Path, start: int, write_samples: bool, stamp: str):
        self.shards = run_dir / "shards"
        self.start, self.end, self.stamp = start, start, stamp
        self.tables: dict[str, list[pa.Table]] = {name: [] for name in SMALL_TABLES}  # compacted chunks
        self._recent: dict[str, list[pa.Table]] = {name: [] for name in SMALL_TABLES}  # one table per session
        self.render_stats: Counter = Counter()
        self.data_warnings: Counter = Counter()
        self.renderers: dict[str, dict] = {}
        self.size = 0  # table rows
        self.samples_bytes = 0
        self._opened = time.monotonic()
        self._first: str | None = None
        self._ids = IdDigest()
        self._samples_path = self.shards / f"{shard_name(start)}.samples.arrows"
        self._samples_tmp: Path | None = None
        self._samples: Any = None
        if write_samples:
            fd, name = tempfile.mkstemp(dir=self.shards, prefix=f".{shard_name(start)}.samples.", suffix=".tmp")
            self._samples_tmp = Path(name)
            self._samples = os.fdopen(fd, "wb")

    def add(self, session_id: str, rows: SessionRows) -> pa.Buffer | None:
        """Take a session's rows; returns the samples stream it appended to the shard's samples
        file (None: no samples)."""
        self._first = session_id if self._first is None else self._first
        self._ids.add(session_id)
        self.end += 1
        for name in SMALL_TABLES:
            table = rows.table(name)
            self._recent[name].append(table)
            if name in ("turns", "quarantine"):
                self.size += table.num_rows
            if len(self._recent[name]) >= COMPACT_EVERY:
                # A table costs kilobytes beyond its rows (schema, buffers): a shard of thousands
                # of one-turn sessions would hold a gigabyte of them. One table per chunk instead.
                self.tables[name].append(_concat(self._recent[name]).combine_chunks())
                self._recent[name] = []
        self.render_stats.update(rows.render_stats)
        self.data_warnings.update(rows.data_warnings)
        if rows.renderer:
            self.renderers.setdefault(json.dumps(rows.renderer, sort_keys=True), rows.renderer)
        stream = rows.samples_stream() if self._samples is not None else None
        if stream is not None:
            with writing(self._samples_path):
                self._samples.write(struct.pack("<Q", stream.size))
                self._samples.write(stream)
            self.samples_bytes += stream.size
        return stream

    def full(self, limits: Limits) -> bool:
        return (
            self.size >= limits.rows
            or self.samples_bytes >= limits.bytes
            or time.monotonic() - self._opened >= limits.seconds
        )

    def close(self) -> Marker:
        """Write the shard's files, then its marker (last: a shard without one is unfinished)."""
        name = shard_name(self.start)
        files: dict[str, list[Any]] = {}
        for table, parts in self.tables.items():
            path = self.shards / f"{name}.{table}.parquet"
            write_parquet_atomic(_concat(parts + self._recent[table]), path)
            files[path.name] = file_entry(path)
        if self._samples is not None and self._samples_tmp is not None:
            with writing(self._samples_path):
                self._samples.close()
            os.chmod(self._samples_tmp, plain_file_mode())
            os.replace(self._samples_tmp, self._samples_path)
            files[self._samples_path.name] = file_entry(self._samples_path)
        marker = Marker(
            self.start,
            self.end,
            self._first or "",
            self._ids.value(),
            files,
            self.stamp,
            render_stats=dict(self.render_stats),
            renderers=list(self.renderers.values()),
            data_warnings=dict(self.data_warnings),
        )
        write_json_atomic(asdict(marker), self.shards / f"{name}.done")
        return marker

    def discard(self) -> None:
        """Drop an unfinished shard's temporary samples file (an error or interrupt stopped the run)."""
        if self._samples is not None and self._samples_tmp is not None:
            try:
                self._samples.close()
            except OSError:
                pass
            self._samples_tmp.unlink(missing_ok=True)
            self._samples = None


def _concat(parts: list[pa.Table]) -> pa.Table:
    """One table from a shard's per-session tables, under their unified schema."""
    parts = [part for part in parts if part.num_columns]
    if not parts:
        return pa.table({})
    schema = pa.unify_schemas([part.schema for part in parts], promote_options="permissive")
    return pa.concat_tables([part if part.schema == schema else _conform(part, schema) for part in parts])


# -- merging ------------------------------------------------------------------------------------
def check_coverage(markers: list[Marker], sessions: int) -> None:
    """The shards cover stream positions 0 … sessions−1 once each, or the merge would lose or
    repeat sessions."""
    expected = 0
    for marker in markers:
        if marker.start != expected:
            raise TraceToolsError(
                f"the shards cover sessions up to {expected - 1}, then start again at {marker.start}; "
                "rerun with --overwrite"
            )
        expected = marker.end
    if expected != sessions:
        raise TraceToolsError(f"the shards hold {expected} sessions of {sessions}; rerun with --overwrite")


def merge(run_dir: Path, markers: list[Marker], extra_quarantine: list[dict[str, Any]]) -> None:
    """Write RUN/<table>.parquet from the shard files, streaming shard by shard, one schema per
    table (the samples stay one part per shard: `io.sample_parts`).

    Quarantine lists `extra_quarantine` (rows of no session), then every session quarantined while
    loading, then every replay error, each in stream order."""
    shards = run_dir / "shards"
    for name in SMALL_TABLES:
        paths = [marker.path(shards, f"{name}.parquet") for marker in markers]
        schemas = [pq.read_schema(path) for path in paths]
        tables: Iterable[pa.Table] = map(_read_shard_table, paths)
        if name == "quarantine":
            extra = _small_table(name, extra_quarantine)
            schemas, tables = [extra.schema, *schemas], chain([extra], _loading_then_replay(paths))
        _stream_tables(schemas, tables, run_dir / f"{name}.parquet")


def _loading_then_replay(paths: list[Path]) -> Iterator[pa.Table]:
    """The shards' quarantine entries, read one shard at a time: those made while loading, then
    the replay errors."""
    for replay in (False, True):
        for path in paths:
            table = _read_shard_table(path)
            if table.num_rows:
                import pyarrow.compute as pc  # only for a run that quarantined something

                mask = pc.equal(table.column("reason"), "replay_error")
                yield table.filter(mask if replay else pc.invert(mask))


def _read_shard_table(path: Path) -> pa.Table:
    """One shard's table, read as one Parquet file: `pq.read_table` goes through pyarrow's dataset
    layer, whose import took 20 ms at the end of every run."""
    with pq.ParquetFile(path) as parquet:
        return parquet.read()


@dataclass
class ShardMeta:
    """Summed over every shard (resumed ones included)."""

    render_stats: dict[str, int]
    renderers: list[dict[str, Any]]  # distinct identities, in stream order
    data_warnings: dict[str, int]


def shard_meta(markers: list[Marker]) -> ShardMeta:
    stats: Counter = Counter()
    warnings: Counter = Counter()
    renderers: dict[str, dict] = {}
    for marker in markers:
        stats.update(marker.render_stats)
        warnings.update(marker.data_warnings)
        for identity in marker.renderers:
            renderers.setdefault(json.dumps(identity, sort_keys=True), identity)
    return ShardMeta(dict(stats), list(renderers.values()), dict(warnings))


def _stream_tables(schemas: list[pa.Schema], tables: Iterable[pa.Table], target: Path) -> None:
    """Write `tables`, taken one at a time, into `target` under the unification of `schemas`."""
    schemas = [schema for schema in schemas if len(schema)]
    if not schemas:
        write_parquet_atomic(pa.table({}), target)
        return
    schema = pa.unify_schemas(schemas, promote_options="permissive").remove_metadata()
    with atomic_open(target, "wb") as handle, pq.ParquetWriter(handle, schema) as writer:
        for table in tables:
            if table.num_rows:
                writer.write_table(_conform(table, schema))


def _conform(table: pa.Table, schema: pa.Schema) -> pa.Table:
    columns = []
    for field_ in schema:
        if field_.name in table.column_names:
            column = table.column(field_.name)
            # A cast imports pyarrow.compute (40 ms a process): none where the type is already
            # the one asked, nor for a column of nulls (a session with no drift), which is made.
            if column.type == field_.type:
                columns.append(column)
            elif pa.types.is_null(column.type):
                columns.append(pa.nulls(table.num_rows, field_.type))
            else:
                columns.append(column.cast(field_.type))
        else:
            columns.append(pa.nulls(table.num_rows, field_.type))
    return pa.Table.from_arrays(columns, schema=schema)
