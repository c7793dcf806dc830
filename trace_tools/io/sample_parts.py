"""RUN/samples/: a run's samples as one Parquet file per shard and a manifest listing them, read
as one dataset (docs/run_directory.md#samples).

    RUN/samples/SSSSSSS.parquet   the samples of the shard whose first session is at stream position SSSSSSS
    RUN/samples/manifest.json     written at the end of the run: every part in stream order, its rows and bytes

The shard being written has its part encoded session by session as its samples arrive
(`append`), on a thread of its own (Arrow encodes and compresses without holding the GIL), so
the encoding runs beside the replay instead of after its last session; the part is renamed into
place when the shard closes. A part records (Parquet key-value metadata) the sha256 of the
shard's samples file (`shards/SSSSSSS.samples.arrows`) holding the same samples: a resumed run
reuses every part of a shard it reuses, and encodes only the others from their shard's file, on
a pool of threads.
"""

from __future__ import annotations

import logging
import os
import struct
import tempfile
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Iterable

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
ENCODERS = max(1, min(4, os.cpu_count() or 1))  # shards of a resumed run encoding at once
LIVE_BACKLOG_BYTES = 64 * 2**20  # samples waiting for the live part's thread before `append` waits
_READ_HERE = pa.ipc.IpcReadOptions(use_threads=False)  # the encoding thread decodes its own input
log = logging.getLogger(__name__)


class SampleParts:
    """The parts of one run: encoded as their shards fill (`append`), or from a closed shard's
    file (`add`, for a shard whose samples were not appended), and listed by `finish`."""

    def __init__(self, run_dir: Path, observe: Callable[[pa.Table], None] | None = None):
        """`observe` is handed every samples table this run encodes (`observed_all`: every part
        of the run was), on the thread that encodes it."""
        self.run_dir, self.dir = run_dir, run_dir / DIR
        self.observed_all = True
        self.observe = None if observe is None else self._observing(observe)
        self.dir.mkdir(exist_ok=True)
        for stale in self.dir.glob(".*.tmp"):  # a killed run's (this process holds the run's lock)
            stale.unlink()
        self._pool = ThreadPoolExecutor(ENCODERS, thread_name_prefix="trace-tools-samples")
        self._live_thread = ThreadPoolExecutor(1, thread_name_prefix="trace-tools-samples-live")
        self._live: _LivePart | None = None
        self._jobs: dict[str, Future] = {}

    def _observing(self, observe: Callable[[pa.Table], None]) -> Callable[[pa.Table], None]:
        """`observe`, kept from the samples' own path: an observer that fails is not asked again
        and the run goes on (`observed_all` turns false, so whoever wanted every table reads the
        samples back instead), since what it gathers is an optimisation, not output."""

        def observe_or_give_up(samples: pa.Table) -> None:
            if not self.observed_all:
                return
            try:
                observe(samples)
            except Exception as error:
                log.warning("gathering the report's sample bars failed (%r); the report reads the samples", error)
                self.observed_all = False

        return observe_or_give_up

    def append(self, shard: str, samples: pa.Table | pa.Buffer) -> None:
        """A session's samples (a table, or its IPC stream) joined shard `shard`, which is being
        written: encode them into its part now, in the background."""
        if self._live is None or self._live.shard != shard:
            self._live = _LivePart(shard, self.dir / f"{shard}.parquet", self._live_thread, self.observe)
        self._live.append(samples)

    def add(self, marker: Any) -> None:
        """A shard was written: finish its part, or encode it from the shard's samples file in the
        background (a shard whose samples were not appended)."""
        source = marker.path(self.run_dir / "shards", "samples.arrows")
        if source.name in marker.files:
            sha = marker.files[source.name][1]
            if self._live is not None and self._live.shard == marker.name:
                self._jobs[marker.name], self._live = self._live.close(sha), None
            else:
                target = self.dir / f"{marker.name}.parquet"
                self._jobs[marker.name] = self._pool.submit(encode, source, sha, target, self.observe)

    def finish(self, markers: list[Any]) -> None:
        """Every shard is written: encode the parts a reused shard has no current part for, wait
        for every part, drop any other file, then write the manifest."""
        for marker in markers:
            if marker.name in self._jobs:
                continue
            if _current(self.dir / f"{marker.name}.parquet", marker):
                self.observed_all = False  # reused as it is: its samples are not read
            else:
                self.add(marker)
        with writing(self.dir):
            try:
                for job in self._jobs.values():
                    job.result()
            finally:
                self._pool.shutdown(wait=True)
                self._live_thread.shutdown(wait=True)
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
        """The run stops: pending parts are not started, running ones finish (each is atomic), and
        the part of the shard being written is dropped."""
        if self._live is not None:
            self._live.discard()
            self._live = None
        self._live_thread.shutdown(wait=True)
        self._pool.shutdown(wait=True, cancel_futures=True)


def _current(part: Path, marker: Any) -> bool:
    """Whether `part` was encoded from the shard samples file `marker` lists (a resumed run's)."""
    source = marker.files.get(f"{marker.name}.samples.arrows")
    if source is None or not part.is_file():
        return False
    try:
        metadata = pq.read_metadata(part).metadata or {}
    except (pa.ArrowException, OSError):
        return False
    return metadata.get(SOURCE_KEY) == source[1].encode()


def encode(source: Path, sha: str, target: Path, observe: Callable[[pa.Table], None] | None = None) -> None:
    """A shard's samples file (length-prefixed IPC streams, one per session) as one Parquet part."""
    part = _PartWriter(target, observe)
    try:
        with pa.memory_map(str(source)) as mapped:
            for stream in sample_streams(mapped.read_buffer()):
                part.add(stream)
    except BaseException:
        part.discard()
        raise
    part.close(sha)


class _PartWriter:
    """One part, written under a temporary name from sessions' samples in stream order, and
    renamed into place by `close`, which records the sha256 of the shard samples file holding the
    same samples. The first error is kept: later samples are not written, `close` raises it."""

    def __init__(self, target: Path, observe: Callable[[pa.Table], None] | None = None):
        self.target, self.observe = target, observe
        fd, name = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
        os.close(fd)
        self.tmp = Path(name)
        try:
            with writing(target):
                self._writer = pq.ParquetWriter(self.tmp, SAMPLES_SCHEMA, **SAMPLES_WRITE_OPTIONS)
        except BaseException:
            self.tmp.unlink(missing_ok=True)
            raise
        self._buffer = TableBuffer(self._writer.write_table)
        self._error: BaseException | None = None

    def add(self, samples: pa.Table | pa.Buffer) -> None:
        if self._error is not None:
            return
        try:
            with writing(self.target):
                if isinstance(samples, pa.Buffer):
                    samples = pa.ipc.open_stream(samples, options=_READ_HERE).read_all()
                self._buffer.add(samples.replace_schema_metadata(None))
            if self.observe is not None:
                self.observe(samples)
        except BaseException as error:
            self._error = error
            raise

    def close(self, sha: str) -> None:
        try:
            if self._error is not None:
                raise self._error
            with writing(self.target):
                self._buffer.flush()
                self._writer.add_key_value_metadata({SOURCE_KEY: sha.encode()})
                self._writer.close()
                os.chmod(self.tmp, plain_file_mode())
                os.replace(self.tmp, self.target)
        finally:
            self.discard()

    def discard(self) -> None:
        if self._writer.is_open:
            try:
                self._writer.close()
            except (OSError, pa.ArrowException):
                pass
        self.tmp.unlink(missing_ok=True)


class _LivePart:
    """The part of the shard being written, encoded on one thread (so in stream order) while the
    replay goes on. At most `LIVE_BACKLOG_BYTES` of samples wait for that thread: past that,
    `append` waits for the oldest, so a replay faster than the encoding does not pile them up in
    memory."""

    def __init__(
        self, shard: str, target: Path, thread: ThreadPoolExecutor, observe: Callable[[pa.Table], None] | None
    ):
        self.shard, self._thread = shard, thread
        self._part = _PartWriter(target, observe)
        self._waiting: deque[tuple[Future, int]] = deque()
        self._waiting_bytes = 0

    def append(self, samples: pa.Table | pa.Buffer) -> None:
        size = samples.size if isinstance(samples, pa.Buffer) else samples.get_total_buffer_size()
        while self._waiting and (self._waiting[0][0].done() or self._waiting_bytes + size > LIVE_BACKLOG_BYTES):
            future, done_size = self._waiting.popleft()
            future.exception()  # waits; an error is raised again by `close`
            self._waiting_bytes -= done_size
        self._waiting.append((self._thread.submit(self._part.add, samples), size))
        self._waiting_bytes += size

    def close(self, sha: str) -> Future:
        return self._thread.submit(self._part.close, sha)

    def discard(self) -> None:
        self._thread.submit(self._part.discard)


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
