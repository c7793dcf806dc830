"""The replay engine: stream a dump's sessions through every strategy into a run directory.

    pipeline pass 1 (index) → pass 2 (sessions as they complete) → executor (this process or a
    process pool) → rows in stream order → shards of SHARD_SIZE sessions, each written
    atomically → merged tables (`io.rundir`)

    on Ray: pass 1 only → each session's slot (where its rows are) → tasks that read, check and
    replay their own rows → rows as they finish → put back in stream order → the same shards

Every session has a position in the stream (quarantined ones too), and shard i holds positions
[i·size, (i+1)·size), so the run directory is the same for every executor. Only the sessions in
flight and the rows of the shard being filled are in memory. A shard that is already finished
(same options, same inputs) is not replayed again, so a killed run resumes.
The run-level summary, report.md and plots are computed from the merged tables by the caller
(`trace_tools.api.replay`), which keeps this layer free of reporting.
"""

from __future__ import annotations

import os
import time
from collections import deque
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

from trace_tools.data import Session
from trace_tools.errors import UnusableInput
from trace_tools.io import rundir, storage
from trace_tools.io.storage import Location
from trace_tools.replay.executors import RayStats, check_executor, default_workers, ray_results, run_sessions
from trace_tools.replay.preflight import check_dump, check_options, check_run_dir
from trace_tools.replay.session import ReplayOptions
from trace_tools.strategies.base import available_strategies, get_strategy

SHARD_SIZE = 16  # sessions per shard; `$TRACE_TOOLS_SHARD_SIZE` overrides it (part of the fingerprint)


def shard_size() -> int:
    value = os.environ.get("TRACE_TOOLS_SHARD_SIZE", "")
    return max(1, int(value)) if value.isdigit() else SHARD_SIZE


@dataclass
class EngineResult:
    """What the engine wrote, and what it read to do so."""

    run_dir: Path
    dump: Location
    options: ReplayOptions
    files: list[str]
    rows: int
    session_count: int
    sessions_replayed: int
    vocab_checked: bool
    meta: Any
    warnings: list[str]
    resumed_shards: int = 0
    render_stats: dict[str, int] = field(default_factory=dict)
    renderers: list[dict[str, Any]] = field(default_factory=list)
    data_warnings: dict[str, int] = field(default_factory=dict)  # legal oddities of valid sessions (io.load)
    ray: RayStats = field(default_factory=RayStats)  # what a Ray run sent and where it ran (not written)


def default_dump() -> Path:
    """The bundled sample_traces/, found in an editable install and in a wheel install alike."""
    from trace_tools.io.bundled import sample_dir

    found = sample_dir()
    if found is not None:
        return found
    raise UnusableInput("the bundled sample_traces/ dump is missing from this install; pass a DUMP path")


def default_run_dir(dump: Location) -> Path:
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    return Path("trace-tools-runs") / f"{storage.stem(dump)}-{stamp}"


def run(
    dump: Location | None,
    options: ReplayOptions,
    out: str | Path | None = None,
    *,
    workers: int | None = None,
    executor: str = "local",
    address: str | None = None,
    progress: Callable[[int, int], None] | None = None,
    overwrite: bool = False,
    mirror: Any = None,
) -> EngineResult:
    """Replay `dump` under `options` into a run directory (tables only; see the module docstring).

    Everything that would make every session fail the same way is checked before the first one
    (`preflight`): a usage error (exit 2) then, never a quarantine of everything. `mirror` (an
    `io.storage.StagedRun`, for a run directory in object storage) hears when the shards were
    reset and when each one is written."""
    from trace_tools.pipeline import Pipeline

    workers = workers or default_workers()
    check_executor(executor, workers)
    dump_path = storage.location(dump) if dump is not None else default_dump()
    options.strategies = list(options.strategies or available_strategies())
    for name in options.strategies:
        get_strategy(name)  # fail fast on an unknown name, before any work
    check_options(options)
    pipeline = Pipeline(
        dump_path,
        tokenizer=options.tokenizer,
        chat_template=options.chat_template,
        canonicalization=options.canonicalization,
        prompt_source=options.prompt_source,
        tool_format=options.tool_format,
        id_arrays=workers > 1,
    )
    options.chat_template = pipeline.renderers.chat_template  # a file, made absolute
    run_dir = Path(out) if out is not None else default_run_dir(dump_path)
    stream = pipeline.stream
    size = shard_size()
    stamp = rundir.fingerprint({**asdict(options), "shard_size": size}, stream.files)
    check_dump(dump_path, stream, options)
    check_run_dir(run_dir, stamp, overwrite, asdict(options))
    resumed = rundir.prepare(run_dir, stamp)
    if mirror is not None:
        mirror.shards_reset()
    result = EngineResult(
        run_dir,
        dump_path,
        options,
        stream.files,
        stream.rows,
        stream.session_count,
        0,
        stream.vocab_checked,
        stream.meta,
        list(stream.warnings),
        resumed,
    )
    shards = _Shards(run_dir, size, stream.session_count, options.write_samples, not resumed, progress)
    shards.written = mirror.shard_written if mirror is not None else None
    if executor == "ray":
        slots = (slot for slot in stream.slots() if not shards.resumed(slot.position))
        results = ray_results(slots, stream.context(), options, workers, address, result.ray)
    else:
        results = _local_results(stream, options, workers, shards)
    try:
        for position, rows in results:
            shards.add(position, rows)
        shards.finish()
    except BaseException:
        if shards.samples is not None:
            shards.samples.abandon()
        raise
    result.sessions_replayed = shards.replayed
    meta = rundir.shard_meta(run_dir, shards.count)
    result.render_stats, result.renderers, result.data_warnings = meta.render_stats, meta.renderers, meta.data_warnings
    quarantine = [asdict(entry) for entry in stream.unattributed]
    rundir.merge_shards(run_dir, shards.count, quarantine, options.write_samples and shards.samples is None)
    if shards.samples is not None:
        shards.samples.commit()
    return result


def _local_results(stream: Any, options: ReplayOptions, workers: int, shards: "_Shards") -> Iterator[tuple[int, Any]]:
    """(position, rows) of every session not resumed, in stream order: this process reads the
    sessions (pass 2) and `run_sessions` replays them; a session quarantined while loading goes
    straight to the shards."""
    in_flight: deque[int] = deque()

    def to_replay() -> Iterator[Session]:
        for position, item in stream.positioned():
            if shards.resumed(position):
                continue
            if isinstance(item, Session):
                in_flight.append(position)
                yield item
            else:
                shards.add(position, rundir.SessionRows.quarantined(item))

    for rows in run_sessions(to_replay(), options, workers):
        yield in_flight.popleft(), rows


class _Shards:
    """Shard i holds the sessions at stream positions [i·size, (i+1)·size).

    Results may arrive in any order (Ray hands them back as they finish); they wait here until
    every earlier position is written, so each shard, and samples.parquet, is written in stream
    order, and a shard is closed (and `written(i)` told) as soon as its last session is in."""

    def __init__(
        self,
        run_dir: Path,
        size: int,
        total: int,
        write_samples: bool,
        fresh: bool,
        progress: Callable[[int, int], None] | None,
    ):
        self.run_dir, self.size, self.total, self.progress = run_dir, size, total, progress
        self.count = -(-total // size)
        self.finished = {i for i in range(self.count) if rundir.shard_done(run_dir, i)}  # by an earlier run
        self.write_samples = write_samples
        # A run that resumed nothing has every session pass through here in order: samples.parquet is written then.
        self.samples = rundir.SamplesFile(run_dir) if write_samples and fresh else None
        self.written: Callable[[int], None] | None = None
        self.replayed = 0
        self._next = 0  # the next position to write
        self._waiting: dict[int, rundir.SessionRows] = {}
        self._writer: rundir.ShardWriter | None = None
        self._seen = 0

    def resumed(self, position: int) -> bool:
        """True for a session of a shard an earlier run finished (counted, not replayed again)."""
        if position // self.size in self.finished:
            self._tick()
            return True
        return False

    def add(self, position: int, rows: rundir.SessionRows) -> None:
        self._waiting[position] = rows
        self.replayed += rows.replayed
        self._tick()
        self._flush()

    def _flush(self) -> None:
        while self._next < self.total:
            index = self._next // self.size
            if index in self.finished:
                self._next = (index + 1) * self.size
                continue
            rows = self._waiting.pop(self._next, None)
            if rows is None:
                return
            if self._writer is None:
                self._writer = rundir.ShardWriter(self.run_dir, index, self.write_samples)
            self._writer.add(rows)
            if self.samples is not None:
                self.samples.add(rows)
            self._next += 1
            if self._next % self.size == 0 or self._next == self.total:
                self._close(index)

    def _close(self, index: int) -> None:
        assert self._writer is not None
        self._writer.close()
        self._writer = None
        if self.written is not None:
            self.written(index)

    def finish(self) -> None:
        """Every result is in: nothing may still wait (a position no executor returned is a bug)."""
        assert not self._waiting and self._writer is None, "a session's result never came back"

    def _tick(self) -> None:
        """One more session accounted for (replayed, resumed or quarantined while loading)."""
        self._seen += 1
        if self.progress:
            self.progress(self._seen, self.total)


def replay_sessions(sessions: Iterable[Session], options: ReplayOptions, workers: int = 1) -> list[rundir.SessionRows]:
    """Rows for already loaded sessions (tests and notebooks), without a run directory."""
    return list(run_sessions(sessions, options, workers))
