"""The run directory (DESIGN §6): layout, fingerprint, resumable shards, merged tables, reading.

Replay writes it and reports read it; both import this module and nothing of each other.

    RUN/run.json            inputs, options, versions, renderer identities, reconstruction counters
    RUN/turns.parquet       RUN/sessions.parquet   RUN/samples.parquet   RUN/quarantine.parquet
    RUN/fidelity.parquet    RUN/drift.parquet      (prompt fidelity per turn; drift findings)
    RUN/summary.json        RUN/report.md          RUN/plots/*.png
    RUN/shards/             FINGERPRINT, NNNNN.<table>.parquet, NNNNN.samples.arrows, NNNNN.done

Sessions are replayed in shards of consecutive sessions (stream order); each finished shard is
written atomically with a completion marker, so a rerun with the same options and inputs
resumes where it stopped, and the merged tables are the same whatever the worker count. Merging
streams shard by shard (samples record batch by record batch), so it never holds a whole table.
A shard keeps its samples as Arrow IPC streams (zstd), one per session, each preceded by its
length: they are read back only to resume, writing IPC is a tenth of the CPU of encoding the same
table as Parquet, and a session's stream is made where it was replayed (a Ray worker), so the
driver only appends bytes.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import struct
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

import pyarrow as pa
import pyarrow.parquet as pq

from trace_tools.errors import TraceToolsError, UnusableInput

SMALL_TABLES = ("turns", "sessions", "quarantine", "fidelity", "drift")
TABLES = (*SMALL_TABLES, "samples")
SAMPLES_SCHEMA = pa.schema(
    [
        ("strategy", pa.string()),
        ("session_id", pa.string()),
        ("sample_index", pa.int32()),
        ("token_ids", pa.list_(pa.int32())),
        ("response_length", pa.int32()),
        ("loss_mask", pa.list_(pa.int8())),
        ("logprobs", pa.list_(pa.float64())),
        ("source_turn", pa.list_(pa.int32())),
        ("reward", pa.float64()),
        ("metadata", pa.string()),  # the strategy's per-sample metadata, JSON
    ]
)
# Samples hold every token of every sample: dictionary-encoding those columns costs time and
# space (ids, masks and logprobs rarely repeat within a page), zstd halves the write time and
# shrinks the file about fourfold against the default snappy + dictionary.
SAMPLES_WRITE_OPTIONS: dict[str, Any] = {
    "compression": "zstd",
    "use_dictionary": ["strategy", "session_id", "metadata"],
}
SAMPLES_IPC_OPTIONS = pa.ipc.IpcWriteOptions(compression="zstd")
SAMPLES_QUEUE = 32  # sessions' samples waiting for the samples.parquet writer thread
# IPC streams are decoded (and decompressed) by the thread that reads them, not Arrow's pool: the
# samples.parquet writer thread's cost stays its own, beside the loop that hands out work.
_READ_HERE = pa.ipc.IpcReadOptions(use_threads=False)
DRIFT_SCHEMA = pa.schema(
    [
        ("session_id", pa.string()),
        ("turn_index", pa.int32()),
        ("echo_turn", pa.int32()),
        ("cause", pa.string()),
        ("causes", pa.list_(pa.string())),
        ("token_drift", pa.bool_()),
        ("divergence", pa.int32()),
        ("served_len", pa.int32()),
        ("prompt_len", pa.int32()),
        ("message_diff", pa.list_(pa.string())),
        ("window_start", pa.int32()),
        ("shared_ids", pa.list_(pa.int32())),
        ("served_ids", pa.list_(pa.int32())),
        ("rendered_ids", pa.list_(pa.int32())),
        ("shared_tokens", pa.list_(pa.string())),
        ("served_tokens", pa.list_(pa.string())),
        ("rendered_tokens", pa.list_(pa.string())),
    ]
)
QUARANTINE_COLUMNS = {"session_id": pa.string(), "turn_index": pa.int32(), "reason": pa.string(), "detail": pa.string()}


@dataclass
class SessionRows:
    """What replaying one session produced, in run-directory rows; `samples` is an Arrow table
    (compact, cheap to ship from a worker process). `pack()` turns every table into an Arrow IPC
    stream (`tables`, `samples_ipc`), so a result crosses from a Ray worker to the driver as a few
    buffers: no per-row or per-column decoding in Python there, and the samples' stream is
    appended to the shard as it is."""

    turns: list[dict[str, Any]] = field(default_factory=list)
    sessions: list[dict[str, Any]] = field(default_factory=list)
    quarantine: list[dict[str, Any]] = field(default_factory=list)
    fidelity: list[dict[str, Any]] = field(default_factory=list)
    drift: list[dict[str, Any]] = field(default_factory=list)
    samples: pa.Table | None = None
    samples_ipc: pa.Buffer | None = None  # the samples as one Arrow IPC stream, once packed
    render_stats: dict[str, int] = field(default_factory=dict)
    renderer: dict[str, Any] = field(default_factory=dict)  # identity of the renderer used
    data_warnings: dict[str, int] = field(default_factory=dict)  # io.load.session_warnings counts
    tables: dict[str, pa.Buffer] = field(default_factory=dict)  # SMALL_TABLES as IPC streams, once packed
    replayed: bool = True  # False: quarantined while loading, never replayed
    cpu_s: float = 0.0  # CPU the replay took where it ran (not written: the benchmark reads it)
    node: str = ""  # the Ray node it ran on, if any (not written)
    input_bytes: int = 0  # bytes of row data a Ray task received (not written)

    @classmethod
    def quarantined(cls, entries: Iterable[Any]) -> "SessionRows":
        """A session quarantined while loading: its `QuarantineEntry`s, nothing replayed."""
        return cls(quarantine=[dataclasses.asdict(entry) for entry in entries], replayed=False)

    def pack(self) -> "SessionRows":
        for name in SMALL_TABLES:
            self.tables[name] = _ipc_stream(_small_table(name, getattr(self, name)))
            setattr(self, name, [])
        self.samples_ipc, self.samples = self.samples_stream(), None
        return self

    def table(self, name: str) -> pa.Table:
        if name in self.tables:
            return pa.ipc.open_stream(self.tables[name], options=_READ_HERE).read_all()
        return _small_table(name, getattr(self, name))

    def samples_stream(self) -> pa.Buffer | None:
        """The samples as a compressed Arrow IPC stream (None when there are none)."""
        if self.samples_ipc is not None or self.samples is None or not self.samples.num_rows:
            return self.samples_ipc
        return _ipc_stream(self.samples, SAMPLES_IPC_OPTIONS)

    def samples_table(self) -> pa.Table | None:
        if self.samples is None and self.samples_ipc is not None:
            return pa.ipc.open_stream(self.samples_ipc, options=_READ_HERE).read_all()
        return self.samples


def _ipc_stream(table: pa.Table, options: pa.ipc.IpcWriteOptions | None = None) -> pa.Buffer:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema, options=options) as writer:
        writer.write_table(table)
    return sink.getvalue()


SHARD_FORMAT = 3  # 2: samples in Arrow IPC; 3: every session has a position (quarantined ones too)


def fingerprint(options: dict[str, Any], files: Iterable[str]) -> str:
    """Options, each input file's path, size and modification time, and the shard format: what a
    resume must match."""
    from trace_tools.io import storage

    inputs = [storage.stamp(f) for f in files]
    blob = json.dumps({"options": options, "inputs": inputs, "format": SHARD_FORMAT}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def prepare(run_dir: Path, stamp: str) -> int:
    """Create the directory; keep finished shards only when the fingerprint matches. Returns how
    many finished shards were kept."""
    if run_dir.exists() and not run_dir.is_dir():
        raise UnusableInput(f"--out {run_dir} is a file, not a directory; pass a directory path")
    shards = run_dir / "shards"
    marker = shards / "FINGERPRINT"
    if marker.exists() and marker.read_text().strip() != stamp:
        shutil.rmtree(shards)
    shards.mkdir(parents=True, exist_ok=True)
    marker.write_text(stamp)
    return len(list(shards.glob("*.done")))


def shard_done(run_dir: Path, index: int) -> bool:
    return (run_dir / "shards" / f"{index:05d}.done").exists()


class ShardWriter:
    """Collects the rows of one shard; samples go to disk session by session."""

    def __init__(self, run_dir: Path, index: int, write_samples: bool):
        self.base = run_dir / "shards" / f"{index:05d}"
        self.tables: dict[str, list[pa.Table]] = {name: [] for name in SMALL_TABLES}
        self.render_stats: Counter = Counter()
        self.data_warnings: Counter = Counter()
        self.renderers: dict[str, dict] = {}
        self._samples_tmp = Path(f"{self.base}.samples.arrows.tmp")
        self._samples = open(self._samples_tmp, "wb") if write_samples else None

    def add(self, rows: SessionRows) -> None:
        for name in SMALL_TABLES:
            self.tables[name].append(rows.table(name))
        self.render_stats.update(rows.render_stats)
        self.data_warnings.update(rows.data_warnings)
        if rows.renderer:
            self.renderers.setdefault(json.dumps(rows.renderer, sort_keys=True), rows.renderer)
        stream = rows.samples_stream() if self._samples is not None else None
        if self._samples is not None and stream is not None:
            self._samples.write(struct.pack("<Q", stream.size))
            self._samples.write(stream)

    def close(self) -> None:
        from trace_tools.io.write import write_json_atomic

        for name, parts in self.tables.items():
            _concat_write(parts, Path(f"{self.base}.{name}.parquet"))
        meta = {"render_stats": dict(self.render_stats), "renderers": list(self.renderers.values())}
        write_json_atomic({**meta, "data_warnings": dict(self.data_warnings)}, Path(f"{self.base}.meta.json"))
        if self._samples is not None:
            self._samples.close()
            os.chmod(self._samples_tmp, 0o644)
            os.replace(self._samples_tmp, Path(f"{self.base}.samples.arrows"))
        Path(f"{self.base}.done").write_text("ok")


def _small_table(name: str, records: list[dict[str, Any]]) -> pa.Table:
    if name == "quarantine":
        return pa.Table.from_pylist(records, schema=pa.schema(list(QUARANTINE_COLUMNS.items())))
    if name == "drift":
        return pa.Table.from_pylist(records, schema=DRIFT_SCHEMA)
    return pa.Table.from_pylist(records)


class SamplesFile:
    """RUN/samples.parquet written as the sessions come back, beside the shards.

    Merging the shards' samples at the end would decode and encode every token again (a second
    on a long dump, after the last session); a run that resumed nothing has every session pass
    through here in order, so this file is the merged one. A resumed run discards it and merges.

    Encoding Parquet is the costliest thing the driver does per session, so a thread does it
    (Arrow releases the GIL while encoding): the loop that hands out work and takes results is
    not held up by it. The queue between them is bounded."""

    def __init__(self, run_dir: Path):
        import queue
        import threading

        self.target = run_dir / "samples.parquet"
        self._tmp = _samples_tmp(self.target)
        self._writer = pq.ParquetWriter(self._tmp, SAMPLES_SCHEMA, **SAMPLES_WRITE_OPTIONS)
        self._queue: Any = queue.Queue(SAMPLES_QUEUE)
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._write_all, name="trace-tools-samples", daemon=True)
        self._thread.start()

    def add(self, rows: SessionRows) -> None:
        if self._error is not None:
            raise self._error
        self._queue.put(rows)

    def _write_all(self) -> None:
        while (rows := self._queue.get()) is not None:
            if self._error is not None:
                continue  # drain, so add() never blocks; commit() raises it
            try:
                samples = rows.samples_table()
                if samples is not None and samples.num_rows:
                    self._writer.write_table(samples)
            except BaseException as error:  # noqa: BLE001 - handed to the caller's thread
                self._error = error

    def commit(self) -> None:
        self._queue.put(None)
        self._thread.join()
        if self._error is not None:
            raise self._error
        self._writer.close()
        os.chmod(self._tmp, 0o644)
        os.replace(self._tmp, self.target)

    def abandon(self) -> None:
        """Stop the writer thread (the run failed); the temporary file is left, as a killed run leaves it."""
        self._queue.put(None)
        self._thread.join()


def merge_shards(run_dir: Path, shards: int, extra_quarantine: list[dict[str, Any]], write_samples: bool) -> None:
    """Write RUN/<table>.parquet from the shard files, streaming, with one schema per table
    (samples too when `write_samples`: a run that wrote them with `SamplesFile` passes False).

    Quarantine lists `extra_quarantine` (rows of no session), then every session quarantined
    while loading, then every replay error, each in stream order."""
    for name in SMALL_TABLES:
        parts = _shard_files(run_dir, name, shards)
        if name == "quarantine":
            parts = [_small_table(name, extra_quarantine), *_loading_then_replay(parts)]
        _concat_write(parts, run_dir / f"{name}.parquet")
    if write_samples:
        _stream_samples(_shard_paths(run_dir, "samples", shards, "arrows"), run_dir / "samples.parquet")


def _loading_then_replay(parts: list[pa.Table]) -> list[pa.Table]:
    import pyarrow.compute as pc

    replay = [pc.equal(part.column("reason"), "replay_error") for part in parts]
    loading = [part.filter(pc.invert(mask)) for part, mask in zip(parts, replay)]
    return loading + [part.filter(mask) for part, mask in zip(parts, replay)]


@dataclass
class ShardMeta:
    """Summed over every shard (resumed ones included)."""

    render_stats: dict[str, int]
    renderers: list[dict[str, Any]]  # distinct identities
    data_warnings: dict[str, int]


def shard_meta(run_dir: Path, shards: int) -> ShardMeta:
    stats: Counter = Counter()
    warnings: Counter = Counter()
    renderers: dict[str, dict] = {}
    for index in range(shards):
        path = run_dir / "shards" / f"{index:05d}.meta.json"
        if path.exists():
            meta = json.loads(path.read_text())
            stats.update(meta["render_stats"])
            warnings.update(meta["data_warnings"])
            for identity in meta["renderers"]:
                renderers.setdefault(json.dumps(identity, sort_keys=True), identity)
    return ShardMeta(dict(stats), list(renderers.values()), dict(warnings))


def _shard_paths(run_dir: Path, name: str, shards: int, suffix: str = "parquet") -> list[Path]:
    return [p for i in range(shards) if (p := run_dir / "shards" / f"{i:05d}.{name}.{suffix}").exists()]


def _shard_files(run_dir: Path, name: str, shards: int) -> list[pa.Table]:
    return [pq.read_table(p) for p in _shard_paths(run_dir, name, shards)]


def _concat_write(parts: list[pa.Table], path: Path) -> None:
    from trace_tools.io.write import write_parquet_atomic

    parts = [p for p in parts if p.num_columns]
    if not parts:
        write_parquet_atomic(pa.table({}), path)
        return
    schema = pa.unify_schemas([p.schema for p in parts], promote_options="permissive")
    table = pa.concat_tables([p if p.schema == schema else _conform(p, schema) for p in parts])
    write_parquet_atomic(table, path)


def _conform(table: pa.Table, schema: pa.Schema) -> pa.Table:
    columns = []
    for field_ in schema:
        if field_.name in table.column_names:
            columns.append(table.column(field_.name).cast(field_.type))
        else:
            columns.append(pa.nulls(table.num_rows, field_.type))
    return pa.Table.from_arrays(columns, schema=schema)


def _samples_tmp(target: Path) -> Path:
    return target.with_name(f".{target.name}.tmp")


def _stream_samples(paths: list[Path], target: Path) -> None:
    tmp = _samples_tmp(target)
    with pq.ParquetWriter(tmp, SAMPLES_SCHEMA, **SAMPLES_WRITE_OPTIONS) as writer:
        for path in paths:
            with pa.memory_map(str(path)) as source:
                for stream in _sample_streams(source.read_buffer()):
                    for batch in pa.ipc.open_stream(stream, options=_READ_HERE):
                        writer.write_batch(batch)
    os.chmod(tmp, 0o644)
    os.replace(tmp, target)


def _sample_streams(data: pa.Buffer) -> Iterable[pa.Buffer]:
    """The length-prefixed IPC streams of a shard's samples file (`ShardWriter`)."""
    offset = 0
    while offset < data.size:
        (length,) = struct.unpack_from("<Q", data, offset)
        yield data.slice(offset + 8, length)
        offset += 8 + length


def read_table(run_dir: str | Path, name: str, columns: list[str] | None = None) -> Any:
    """One of the run's tables as a DataFrame (empty when absent); `columns` reads only those."""
    import pandas as pd

    path = Path(run_dir) / f"{name}.parquet"
    if not path.exists():
        return pd.DataFrame()
    if columns is not None:
        present = set(pq.read_schema(path).names)
        columns = [c for c in columns if c in present]
    return pq.read_table(path, columns=columns).to_pandas()


def require_run(run_dir: str | Path) -> Path:
    """A finished run directory, or a clear error naming the fix."""
    path = Path(run_dir)
    if not (path / "summary.json").is_file():
        raise TraceToolsError(
            f"{path} is not a finished run directory (no summary.json); "
            f"run `trace-tools replay DUMP --out {path}` first"
        )
    return path


def load_summary(run_dir: str | Path) -> dict[str, Any]:
    return json.loads((require_run(run_dir) / "summary.json").read_text())


def load_run_info(run_dir: str | Path) -> dict[str, Any]:
    path = Path(run_dir) / "run.json"
    return json.loads(path.read_text()) if path.is_file() else {}


_LIST_COLUMNS = {field_.name: field_.type for field_ in SAMPLES_SCHEMA if pa.types.is_list(field_.type)}


def samples_table(rows: list[dict[str, Any]]) -> pa.Table:
    """`SAMPLES_SCHEMA` rows as a table, converting each distinct id/mask/logprob list once.

    A session's strategies mostly emit the same sequences (the same full trajectory, the same
    provenance); converting 50k-element Python lists is the expensive part, and comparing two
    lists of shared ints is cheap, so equal lists share one converted array."""
    columns: dict[str, Any] = {}
    for field_ in SAMPLES_SCHEMA:
        values = [row[field_.name] for row in rows]
        kind = _LIST_COLUMNS.get(field_.name)
        columns[field_.name] = pa.array(values, field_.type) if kind is None else _list_column(values, kind)
    return pa.Table.from_pydict(columns, schema=SAMPLES_SCHEMA)


def _list_column(values: list[Any], kind: pa.ListType) -> pa.Array:
    converted: dict[int, list[tuple[Any, pa.Array]]] = {}
    pieces, offsets = [], [0]
    for value in values:
        same_length = converted.setdefault(len(value), [])
        array = next((array for seen, array in same_length if seen is value or seen == value), None)
        if array is None:
            array = pa.array(value, kind.value_type)
            same_length.append((value, array))
        pieces.append(array)
        offsets.append(offsets[-1] + len(value))
    flat = pa.concat_arrays(pieces) if pieces else pa.array([], kind.value_type)
    return pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), flat, type=kind)
