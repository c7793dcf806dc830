"""RUN/samples/: a run's samples as one Parquet file per shard and a manifest listing them, read
as one dataset (docs/run_directory.md#samples).

    RUN/samples/SSSSSSS.parquet   the samples of the shard whose first session is at stream position SSSSSSS
    RUN/samples/manifest.json     written at the end of the run: every part in stream order, its rows and bytes

A shard's samples are encoded as Parquet when the shard closes, by a pool of threads (Arrow
encodes and compresses without holding the GIL), so shards encode side by side while the run goes
on, instead of one thread encoding every sample. A part records the sha256 of the shard's
samples file (`shards/SSSSSSS.samples.arrows`) it was encoded from: a resumed run reuses every
part of a shard it reuses, and encodes only the others.
"""

from __future__ import annotations

import os
import struct
import tempfile
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Iterable

import pyarrow as pa
import pyarrow.parquet as pq

from trace_tools.io import storage
from trace_tools.io.rundir import SAMPLES_SCHEMA, SAMPLES_WRITE_OPTIONS, TableBuffer
from trace_tools.io.storage import Location
from trace_tools.io.write import plain_file_mode, write_json_atomic, writing

DIR = "samples"
MANIFEST = "manifest.json"
LEGACY = "samples.parquet"  # one file, as runs before the manifest (and audit-samples) write it
SOURCE_KEY = b"trace_tools.shard_samples_sha256"
ENCODERS = max(1, min(4, os.cpu_count() or 1))  # shards encoding at once
_READ_HERE = pa.ipc.IpcReadOptions(use_threads=False)  # the encoding thread decodes its own input


class SampleParts:
    """The parts of one run, encoded as its shards close (`add`) and listed by `finish`."""

    def __init__(self, run_dir: Path):
        self.run_dir, self.dir = run_dir, run_dir / DIR
        self.dir.mkdir(exist_ok=True)
        for stale in self.dir.glob(".*.tmp"):  # a killed run's (this process holds the run's lock)
            stale.unlink()
        self._pool = ThreadPoolExecutor(ENCODERS, thread_name_prefix="trace-tools-samples")
        self._jobs: dict[str, Future] = {}

    def add(self, marker: Any) -> None:
        """A shard was written: encode its samples in the background."""
        source = marker.path(self.run_dir / "shards", "samples.arrows")
        if source.name in marker.files:
            sha = marker.files[source.name][1]
            self._jobs[marker.name] = self._pool.submit(encode, source, sha, self.dir / f"{marker.name}.parquet")

    def finish(self, markers: list[Any]) -> None:
        """Every shard is written: encode the parts a reused shard has no current part for, wait
        for every part, drop any other file, then write the manifest."""
        for marker in markers:
            if marker.name not in self._jobs and not _current(self.dir / f"{marker.name}.parquet", marker):
                self.add(marker)
        with writing(self.dir):
            try:
                for job in self._jobs.values():
                    job.result()
            finally:
                self._pool.shutdown(wait=True)
        names = {f"{marker.name}.parquet" for marker in markers}
        for path in self.dir.glob("*.parquet"):
            if path.name not in names:
                path.unlink()
        parts = []
        for marker in markers:
            path = self.dir / f"{marker.name}.parquet"
            rows = pq.ParquetFile(path).metadata.num_rows
            parts.append(
                {"file": path.name, "sessions": [marker.start, marker.end], "rows": rows, "bytes": path.stat().st_size}
            )
        write_json_atomic(
            {"format": 1, "rows": sum(part["rows"] for part in parts), "parts": parts}, self.dir / MANIFEST
        )

    def abandon(self) -> None:
        """The run stops: pending parts are not started, running ones finish (each is atomic)."""
        self._pool.shutdown(wait=True, cancel_futures=True)


def _current(part: Path, marker: Any) -> bool:
    """Whether `part` was encoded from the shard samples file `marker` lists (a resumed run's)."""
    source = marker.files.get(f"{marker.name}.samples.arrows")
    if source is None or not part.is_file():
        return False
    try:
        metadata = pq.read_schema(part).metadata or {}
    except (pa.ArrowException, OSError):
        return False
    return metadata.get(SOURCE_KEY) == source[1].encode()


def encode(source: Path, sha: str, target: Path) -> None:
    """A shard's samples file (length-prefixed IPC streams, one per session) as one Parquet part,
    written under a temporary name and renamed."""
    fd, name = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    os.close(fd)
    tmp = Path(name)
    schema = SAMPLES_SCHEMA.with_metadata({SOURCE_KEY: sha.encode()})
    try:
        with writing(target), pq.ParquetWriter(tmp, schema, **SAMPLES_WRITE_OPTIONS) as writer:
            buffer = TableBuffer(writer.write_table)
            with pa.memory_map(str(source)) as mapped:
                for stream in sample_streams(mapped.read_buffer()):
                    table = pa.ipc.open_stream(stream, options=_READ_HERE).read_all()
                    buffer.add(table.replace_schema_metadata(schema.metadata))
            buffer.flush()
        os.chmod(tmp, plain_file_mode())
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)


def sample_streams(data: pa.Buffer) -> Iterable[pa.Buffer]:
    """The length-prefixed IPC streams of a shard's samples file (`io.shards.ShardWriter`)."""
    offset = 0
    while offset < data.size:
        (length,) = struct.unpack_from("<Q", data, offset)
        yield data.slice(offset + 8, length)
        offset += 8 + length


# -- reading ------------------------------------------------------------------------------------
def samples_files(run: Location) -> list[Location]:
    """The files holding a run's samples, in stream order: the manifest's parts, or the one
    samples.parquet of an older run (or of `audit-samples`); none when it wrote no samples."""
    manifest = storage.join(run, DIR, MANIFEST)
    if storage.is_file(manifest):
        from trace_tools.io.rundir import read_json

        parts = read_json(manifest)["parts"]
        return [storage.join(run, DIR, part["file"]) for part in parts]
    legacy = storage.join(run, LEGACY)
    return [legacy] if storage.is_file(legacy) else []


def read_samples(run: Location, columns: list[str] | None = None) -> pa.Table | None:
    """Every sample of a run as one table (None when it wrote none): for notebooks and small runs;
    `samples_files` and batches for anything large."""
    files = samples_files(run)
    if not files:
        return None
    tables = []
    for file in files:
        with storage.open_input(file) as handle:
            tables.append(pq.read_table(handle, columns=columns).replace_schema_metadata(None))
    return pa.concat_tables(tables)
