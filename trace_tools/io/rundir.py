"""The run directory (docs/run_directory.md): layout, table schemas, what a session's replay produced, reading.

Replay writes it and reports read it; both import this module and nothing of each other.

    RUN/run.json            inputs, options, versions, renderer identities, reconstruction counters
    RUN/turns.parquet       RUN/sessions.parquet   RUN/quarantine.parquet
    RUN/samples/            one Parquet part per shard and manifest.json (`io.sample_parts`)
    RUN/fidelity.parquet    RUN/drift.parquet      (prompt fidelity per turn; drift findings)
    RUN/report.md           RUN/report.html        RUN/plots/*.png
    RUN/summary.json        written last: a run directory without it is unfinished
    RUN/shards/, RUN/.lock  resumable shards and the writer's lock (`io.shards`)

Sessions are replayed in shards of consecutive sessions (stream order); each finished shard is
written with a marker that lists its files and their checksums, so a rerun with the same options,
inputs and code resumes where it stopped, and the merged tables are the same whatever the worker
count. A session's result crosses from a worker as Arrow IPC streams (`SessionRows.pack`); a
shard keeps its samples as those streams (zstd), read back only to resume: writing IPC is a tenth
of the CPU of encoding the same table as Parquet.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from trace_tools.errors import TraceToolsError, UnusableInput, UsageError
from trace_tools.ids import common_prefix_len, same_items
from trace_tools.io import storage
from trace_tools.io.storage import Location

SMALL_TABLES = ("turns", "sessions", "quarantine", "fidelity", "drift")
REQUIRED_TABLES = ("turns", "sessions", "quarantine")  # in every finished run, since the first format
_REBUILD = "replay again into it to rebuild it (`trace-tools replay DUMP --out {run}` resumes from its shards)"
TABLES = (*SMALL_TABLES, "samples")
# written into a run by `rescore RUN --samples` (rescore/samples.py, docs/rescore_samples.md)
MISMATCH_TABLES = ("mismatch_tokens.parquet", "mismatch_turns.parquet", "mismatch_sessions.parquet")
# The metrics of each "mismatch" block of summary.json, as rescore computes them (rescore/mismatch.py)
# and gate bounds them (report/gate.py); here, below both, so neither repeats the other's list.
MISMATCH_METRICS = (
    "k1_kl",
    "k3_kl",
    "training_log_ppl",
    "rollout_log_ppl",
    "training_ppl",
    "rollout_ppl",
    "log_ppl_diff",
    "log_ppl_abs_diff",
    "log_ppl_diff_max",
    "log_ppl_diff_min",
    "ppl_ratio",
    "chi2_token",
    "chi2_seq",
    "mean_abs_diff",
    "max_abs_diff",
    "p50_abs_diff",
    "p90_abs_diff",
    "p99_abs_diff",
)
# besides the tables, plots/ and export/
OUTPUT_FILES = ("summary.json", "run.json", "report.md", "report.html", *MISMATCH_TABLES)
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
        ("step", pa.int64()),  # the session's step (docs/trace_schema.md#columns), null without one
    ]
)
# Samples hold every token of every sample: dictionary-encoding those columns costs time and
# space (ids, masks and logprobs rarely repeat within a page), zstd halves the write time and
# shrinks the file about fourfold against the default snappy + dictionary. Min/max statistics
# are kept for the one-value columns a reader may filter on, not for the token lists (no reader
# can use the smallest token id of a row group; computing them was a third of the encode).
SAMPLES_WRITE_OPTIONS: dict[str, Any] = {
    "compression": "zstd",
    "use_dictionary": ["strategy", "session_id", "metadata"],
    "write_statistics": [
        field_.name for field_ in SAMPLES_SCHEMA if not pa.types.is_list(field_.type) and field_.name != "metadata"
    ],
}
SAMPLES_IPC_OPTIONS = pa.ipc.IpcWriteOptions(compression="zstd")
# IPC streams are decoded (and decompressed) by the thread that reads them, not Arrow's pool.
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
    stream (`tables`, `samples_ipc`), so a result crosses from a worker to the driver as a few
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
    data_warnings: dict[str, int] = field(default_factory=dict)  # io.session_checks.session_warnings counts
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


def _small_table(name: str, records: list[dict[str, Any]]) -> pa.Table:
    if name == "quarantine":
        return pa.Table.from_pylist(records, schema=pa.schema(list(QUARANTINE_COLUMNS.items())))
    if name == "drift":
        return pa.Table.from_pylist(records, schema=DRIFT_SCHEMA)
    return pa.Table.from_pylist(records)


class TableBuffer:
    """Small tables gathered into one write of at least `limit` bytes: each write of a record
    batch or row group costs about a millisecond and a row group's metadata, which a dump of many
    one-turn sessions would otherwise pay per session."""

    def __init__(self, write: Any, limit: int = 8 * 2**20):
        self._write, self._limit = write, limit
        self._parts: list[pa.Table] = []
        self._bytes = 0

    def add(self, table: pa.Table | None) -> None:
        if table is None or not table.num_rows:
            return
        self._parts.append(table)
        self._bytes += table.get_total_buffer_size()
        if self._bytes >= self._limit:
            self.flush()

    def flush(self) -> None:
        if self._parts:
            self._write(pa.concat_tables(self._parts).combine_chunks() if len(self._parts) > 1 else self._parts[0])
            self._parts, self._bytes = [], 0


def remove_outputs(run_dir: Path) -> None:
    """Remove every file a previous run wrote into `run_dir` (its tables, summary, reports, plots,
    exports; `io.shards.prepare` removes its shards), before a run with another fingerprint writes
    there: nothing of the previous run may be read as this one's (a `--no-samples` run writes no
    samples to replace the old ones). Only the names a run owns go; `plots/`, `export/` and `samples/`
    only when the directory held a run, so a user's own folders of those names are left alone."""
    owned = [*OUTPUT_FILES, *(f"{name}.parquet" for name in TABLES)]
    folders = ["plots", "export", "samples"] if directory_kind(run_dir) == "run" else []
    for name in owned:
        (run_dir / name).unlink(missing_ok=True)
    for name in folders:
        if (run_dir / name).is_dir():
            shutil.rmtree(run_dir / name)


def read_table(run_dir: Location, name: str, columns: list[str] | None = None) -> Any:
    """One of the run's tables as a DataFrame (empty when absent); `columns` reads only those. The
    run may be a path or a URI (only that table is read)."""
    import pandas as pd

    table = read_arrow(run_dir, name, columns)
    return pd.DataFrame() if table is None else table.to_pandas()


def read_arrow(run_dir: Location, name: str, columns: list[str] | None = None) -> pa.Table | None:
    """`read_table` as an Arrow table, None when absent: for a caller that needs no pandas (the
    command line's replay process, `report.finish`)."""
    table = storage.join(run_dir, f"{name}.parquet")
    if not storage.is_file(table):
        return None
    try:
        with storage.open_input(table) as handle:
            parquet = pq.ParquetFile(handle)
            if columns is not None:
                columns = [c for c in columns if c in parquet.schema_arrow.names]
            return parquet.read(columns=columns)
    except (pa.ArrowException, OSError) as error:
        reason = (str(error).strip().splitlines() or [type(error).__name__])[0]
        run = storage.location(run_dir)
        raise UnusableInput(f"{table} is not readable ({reason}); {_REBUILD.format(run=run)}") from None


def read_json(file: Location) -> Any:
    with storage.open_input(file) as handle:
        return json.loads(handle.read().decode("utf-8"))


def directory_kind(path: Location) -> str | None:
    """`run` for a directory `trace-tools replay` writes, `rescore` for one `trace-tools rescore`
    writes, None for anything else (such directories are outputs, never dumps to read)."""
    if storage.is_file(storage.join(path, "shards", "FINGERPRINT")) or storage.is_file(storage.join(path, "run.json")):
        return "run"
    summary = storage.join(path, "summary.json")
    if not storage.is_file(summary):
        return None
    try:
        keys = read_json(summary)
    except (OSError, ValueError):
        return None
    if isinstance(keys, dict) and "strategies" in keys:
        return "run"
    return "rescore" if isinstance(keys, dict) and "logprobs_source" in keys else None


def not_a_dump(pointed: Path, directory: Path, kind: str) -> str:
    """Why a run or rescore output directory (or a table in one) cannot be read as a dump, naming
    the dump it came from."""
    source = load_run_info(directory).get("inputs", {}).get("dump") if kind == "run" else None
    made = "`trace-tools replay`" if kind == "run" else "`trace-tools rescore`"
    what = "a directory" if pointed == directory else f"a table in {directory}, a directory"
    hint = f"pass the dump it read ({source})" if source else "pass the dump it read"
    return f"{pointed} is {what} written by {made}, not a dump; {hint}"


def require_run(run_dir: Location) -> Location:
    """A finished run directory (a path or a URI), or a clear error naming the fix."""
    run = storage.location(run_dir)
    if directory_kind(run) == "rescore":
        raise TraceToolsError(
            f"{run} is a `trace-tools rescore` output directory, not a replay run: it has no strategies "
            "to report, compare, gate or export; pass a `trace-tools replay --out` directory"
        )
    if not storage.is_file(storage.join(run, "summary.json")):
        raise TraceToolsError(
            f"{run} is not a finished run directory (no summary.json); run `trace-tools replay DUMP --out {run}` first"
        )
    tables = {name: storage.join(run, f"{name}.parquet") for name in REQUIRED_TABLES}
    missing = [f"{name}.parquet" for name, table in tables.items() if not storage.is_file(table)]
    if missing:
        raise UnusableInput(f"{run} has no {' or '.join(missing)}; {_REBUILD.format(run=run)}")
    return run


def load_summary(run_dir: Location) -> dict[str, Any]:
    return read_json(storage.join(require_run(run_dir), "summary.json"))


def load_run_info(run_dir: Location) -> dict[str, Any]:
    """run.json, or {} when it is missing or unreadable."""
    try:
        info = read_json(storage.join(run_dir, "run.json"))
    except (OSError, ValueError, TraceToolsError):
        return {}
    return info if isinstance(info, dict) else {}


_OPTIONAL_SAMPLE_COLUMNS = ("step",)  # null when a row leaves it out
_LIST_COLUMNS = {field_.name: field_.type for field_ in SAMPLES_SCHEMA if pa.types.is_list(field_.type)}


def samples_table(rows: list[dict[str, Any]]) -> pa.Table:
    """`SAMPLES_SCHEMA` rows as a table, converting each distinct id/mask/logprob list once.

    A session's strategies mostly emit the same sequences (the same full trajectory, the same
    provenance), or sequences that share a long prefix (a fork, a healed turn); converting
    50k-element Python lists is the expensive part, and comparing lists of shared ints is cheap,
    so equal lists share one converted array, and a list converts only what follows the prefix it
    shares with the list converted before it."""
    columns: dict[str, Any] = {}
    for field_ in SAMPLES_SCHEMA:
        name = field_.name
        values = [row.get(name) for row in rows] if name in _OPTIONAL_SAMPLE_COLUMNS else [row[name] for row in rows]
        kind = _LIST_COLUMNS.get(name)
        columns[name] = pa.array(values, field_.type) if kind is None else _list_column(values, kind)
    return pa.Table.from_pydict(columns, schema=SAMPLES_SCHEMA)


_SHARED_PREFIX_MIN = 4096  # shorter shared prefixes convert whole (slicing and joining costs more)


def _list_column(values: list[Any], kind: pa.ListType) -> pa.Array:
    converted: dict[int, list[tuple[Any, pa.Array]]] = {}
    last: tuple[Any, pa.Array] | None = None  # measured: looking further back costs more than it saves
    pieces, offsets = [], [0]
    for value in values:
        same_length = converted.setdefault(len(value), [])
        array = next((array for seen, array in same_length if same_items(seen, value)), None)
        if array is None:
            array = _convert(value, kind.value_type, last)
            same_length.append((value, array))
            last = (value, array)
        pieces.append(array)
        offsets.append(offsets[-1] + len(value))
    flat = pa.concat_arrays(pieces) if pieces else pa.array([], kind.value_type)
    return pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), flat, type=kind)


def _convert(value: list[Any], value_type: pa.DataType, last: tuple[Any, pa.Array] | None) -> pa.Array:
    """`pa.array(value)`, reusing the converted prefix `value` shares with the `last` list converted.
    Lists are compared with `==`, as the whole-list sharing above does."""
    if last is None or last[0][:_SHARED_PREFIX_MIN] != value[:_SHARED_PREFIX_MIN]:  # most part early: cheap
        return _arrow_values(value, value_type)
    seen, array = last
    shared = common_prefix_len(seen, value)
    return pa.concat_arrays([array.slice(0, shared), _arrow_values(value[shared:], value_type)])


def _arrow_values(value: list[Any], value_type: pa.DataType) -> pa.Array:
    """`pa.array(value, value_type)`. Integer lists go through NumPy, which packs a list of Python
    ints about four times faster than Arrow's converter (`fromiter`, which knows the length and
    the shape, a third faster again than `np.array`); a list NumPy refuses (a null, an
    out-of-range value) goes to Arrow, which keeps the null or names the value. (Strategies emit
    ints here; NumPy would also take a bool as 0/1, where Arrow refuses it.)"""
    dtype = _NUMPY_INTS.get(value_type)
    if dtype is not None:
        try:
            return pa.array(np.fromiter(value, dtype, len(value)))
        except (TypeError, ValueError, OverflowError):
            pass
    return pa.array(value, value_type)


_NUMPY_INTS = {pa.int32(): np.int32, pa.int8(): np.int8}


def check_output_file(out: Path, inputs: Iterable[Path], overwrite: bool, option: str = "--out") -> None:
    """Refuse an output file that would destroy something the user did not ask to replace: a
    directory, one of the command's own inputs (always), a file directly in a run directory, or
    any existing file (those two unless `overwrite`)."""

    if out.is_dir():
        raise UsageError(f"{option} {out} is a directory; pass a file path")
    target = out.resolve()
    for source in inputs:
        if source.exists() and source.resolve() == target:
            raise UsageError(f"{option} {out} is one of this command's inputs; choose another path")
    if overwrite:
        return
    kind = directory_kind(target.parent)
    if kind is not None:
        raise UsageError(
            f"{option} {out} is inside the {kind} directory {out.parent}, whose files trace-tools manages; "
            "choose a path outside it (or pass --overwrite)"
        )
    if out.exists() or out.is_symlink():
        raise UsageError(f"{option} {out} exists; pass --overwrite to replace it, or choose another path")
