"""The replay engine: stream a dump's sessions through every strategy into a run directory.

    pipeline pass 1 (index) → pass 2 (sessions as they complete) → executor (this process or a
    process pool) → rows in stream order → shards (closed by rows, bytes or time), each finished
    by a marker that lists its files with checksums → merged tables (`io.shards`)

    on Ray: pass 1 only → each session's slot (where its rows are) → tasks that read, check and
    replay their own rows → rows as they finish → put back in stream order → the same shards

Every session has a position in the stream (quarantined ones too), and a shard holds the
consecutive positions its marker records, so the run directory is the same for every executor.
Only the sessions in flight and the rows of the shard being filled are in memory. A shard that is
already finished (same options, inputs and code), whose files check out and whose sessions are the
ones the dump has at its positions, is not replayed again, so a killed run resumes. One process
writes a run directory at a time (`io.shards.RunLock`). The run-level summary, report.md and
plots are computed from the merged tables by the caller (`trace_tools.api.replay`, through
`finish`), which keeps this layer free of reporting.
"""

from __future__ import annotations

import bisect
import time
from collections import deque
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, TypeVar

from trace_tools.collector import collector_off, session_done
from trace_tools.data import Session
from trace_tools.errors import UnusableInput
from trace_tools.io import rundir, sample_parts, shards, storage
from trace_tools.io.bundled import sample_dir
from trace_tools.io.storage import Location
from trace_tools.pipeline import Pipeline
from trace_tools.process_pool import can_fork
from trace_tools.render.harness_identity import resolve_auto_profile
from trace_tools.replay.executors import (
    RayStats,
    auto_workers,
    check_executor,
    default_workers,
    ray_results,
    run_sessions,
)
from trace_tools.replay.local_pool import WorkerPool, started_workers
from trace_tools.replay.preflight import check_dump, check_options, check_run_dir
from trace_tools.replay.session import ReplayOptions
from trace_tools.strategies.registry import available_strategies

T = TypeVar("T")


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
    redone_shards: list[str] = field(default_factory=list)  # finished shards not reused, and why
    render_stats: dict[str, int] = field(default_factory=dict)
    renderers: list[dict[str, Any]] = field(default_factory=list)
    data_warnings: dict[str, int] = field(default_factory=dict)  # legal oddities of valid sessions (io.load)
    notes: list[str] = field(default_factory=list)  # one line each for whoever started the run
    ray: RayStats = field(default_factory=RayStats)  # what a Ray run sent and where it ran (not written)
    samples_observed: bool = False  # `observe_samples` was handed every sample of the run (not written)


def default_dump() -> Path:
    """The bundled sample_traces/, found in an editable install and in a wheel install alike."""

    found = sample_dir()
    if found is not None:
        return found
    raise UnusableInput("the bundled sample_traces/ dump is missing from this install; pass a DUMP path")


def default_run_dir(dump: Location) -> Path:
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    return Path("trace-tools-runs") / f"{storage.stem(dump)}-{stamp}"


def _auto_harness_profile(options: ReplayOptions, meta: Any, dump: Any) -> str | None:
    """checkpoint-tree's `harness_profile=auto`: the shipped profile of the recorded harness."""
    if "checkpoint-tree" not in options.strategies:
        return None
    return resolve_auto_profile(options.params, getattr(meta, "harness", None), dump)


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
    finish: Callable[[EngineResult], T],
    owns_process: bool = False,
    observe_samples: Callable[[Any], None] | None = None,
) -> T:
    """Replay `dump` under `options` into a run directory (tables only; see the module docstring),
    then `finish(result)` (the summary and reports) while this process still holds the run's lock.

    Everything that would make every session fail the same way is checked before the first one
    (`preflight`): a usage error (exit 2) then, never a quarantine of everything. `mirror` (an
    `io.storage.StagedRun`, for a run directory in object storage) fetches the shards this run
    may reuse, hears when the shards were reset and when each one is written, and stops the run
    when an upload failed. `owns_process`: the caller owns this process (the command
    line), so sessions replayed here may pause its garbage collector (`SessionReplayer`).
    `observe_samples` is handed each samples table the run encodes into RUN/samples/, on the
    thread encoding it (`io.sample_parts`; `result.samples_observed`: it saw every one)."""

    dump_path = storage.location(dump) if dump is not None else default_dump()
    options.strategies = list(options.strategies or available_strategies())
    local = executor == "local"
    workers = workers or (auto_workers(dump_path, len(options.strategies)) if local else default_workers())
    check_executor(executor, workers)
    check_options(options)  # the one check of the strategy names and parameters, before any work
    pipeline = Pipeline(
        dump_path,
        tokenizer=options.tokenizer,
        chat_template=options.chat_template,
        canonicalization=options.canonicalization,
        prompt_source=options.prompt_source,
        tool_format=options.tool_format,
        id_arrays=True,  # recorded prompts compared as arrays, made lists after (`pipeline.recorded`)
        render_path=options.render_path,
    )
    if local and workers > 1 and can_fork():
        pipeline.renderers.preload()  # the encoders and templates the forked workers will share
    # Before anything renders: forked workers start from one thread.
    with started_workers(workers if local else 1) as pool:
        options.chat_template = pipeline.renderers.chat_template  # a file, made absolute
        run_dir = Path(out) if out is not None else default_run_dir(dump_path)
        stream = pipeline.stream
        harness_note = _auto_harness_profile(options, stream.meta, dump_path)
        current = shards.fingerprint(options.recorded(), stream.files)
        check_dump(dump_path, stream, options, pipeline.renderers.specs())
        pipeline.renderers.check_templates()
        check_run_dir(run_dir, current, overwrite)
        run_dir.mkdir(parents=True, exist_ok=True)
        with shards.RunLock(run_dir):
            recorded = shards.recorded_fingerprint(run_dir)
            if recorded is None or recorded.get("stamp") != current["stamp"]:
                rundir.remove_outputs(run_dir)  # another run's (`--overwrite`): none of it may pass for this one's
            (run_dir / "summary.json").unlink(missing_ok=True)  # unfinished until it is written again, last
            if mirror is not None:
                mirror.fetch_reused(current["stamp"])  # only the shards this run may reuse come down
            verdict = shards.prepare(run_dir, current)
            if mirror is not None:
                mirror.reset()
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
                redone_shards=verdict.redone,
                notes=[harness_note] if harness_note else [],
            )
            where = (workers, executor, address, owns_process, observe_samples, pool)
            resolved = pipeline.renderers.resolved  # the render specs preflight resolved, reused by every replayer
            with collector_off(owns_process):
                _replay(stream, result, verdict.reusable, current["stamp"], where, progress, mirror, resolved)
                return finish(result)


def _replay(
    stream: Any,
    result: EngineResult,
    reusable: list[shards.Marker],
    stamp: str,
    where: tuple[int, str, str | None, bool, Callable[[Any], None] | None, WorkerPool | None],
    progress: Callable[[int, int], None] | None,
    mirror: Any,
    resolved: dict[tuple, Any],
) -> None:
    """Replay the sessions no reusable shard holds into new shards, then merge every shard.
    `where`: (workers, executor, Ray address, whether the caller owns this process, who observes
    the samples, the local worker pool); `resolved`: the render specs preflight resolved (`RendererPool.resolved`)."""
    options, run_dir = result.options, result.run_dir
    workers, executor, address, owns_process, observe, pool = where
    tracker = _Shards(run_dir, reusable, stream.session_count, options.write_samples, stamp, progress, observe)
    tracker.written = mirror.shard_written if mirror is not None else None
    if executor == "ray":
        slots = (slot for slot in stream.slots() if not tracker.resumed(slot.position, slot.session_id))
        results = ray_results(slots, stream.context(), options, workers, address, result.ray)
    else:
        results = _local_results(stream, options, workers, pool, tracker, owns_process, resolved)
    try:
        for position, rows in results:
            tracker.add(position, rows)
            session_done()
            if mirror is not None:
                mirror.check()  # a failed upload stops the run now, not at its end
        tracker.finish()
    except BaseException:
        tracker.abandon()
        raise
    result.sessions_replayed = tracker.replayed
    result.resumed_shards = len(tracker.reused())
    result.redone_shards += tracker.redone
    markers = tracker.markers()
    shards.check_coverage(markers, stream.session_count)
    meta = shards.shard_meta(markers)
    result.render_stats, result.renderers, result.data_warnings = meta.render_stats, meta.renderers, meta.data_warnings
    quarantine = [asdict(entry) for entry in stream.unattributed]
    shards.merge(run_dir, markers, quarantine)
    if tracker.samples is not None:
        tracker.samples.finish(markers)
        result.samples_observed = observe is not None and tracker.samples.observed_all


def _local_results(
    stream: Any,
    options: ReplayOptions,
    workers: int,
    pool: WorkerPool | None,
    tracker: "_Shards",
    owns_process: bool,
    resolved: dict[tuple, Any],
) -> Iterator[tuple[int, Any]]:
    """(position, rows) of every session not resumed, in stream order: this process reads the
    sessions (pass 2) and `run_sessions` replays them (on `pool`, the run's workers, when
    `workers` > 1); a session quarantined while loading goes straight to the shards."""
    in_flight: deque[int] = deque()

    def to_replay() -> Iterator[Session]:
        for position, item in stream.positioned():
            session_id = item.session_id if isinstance(item, Session) else item[0].session_id
            if tracker.resumed(position, session_id):
                continue
            if isinstance(item, Session):
                in_flight.append(position)
                yield item
            else:
                tracker.add(position, rundir.SessionRows.quarantined(item))

    for rows in run_sessions(to_replay(), options, workers, owns_process, resolved, pool):
        yield in_flight.popleft(), rows


class _Shards:
    """The shards of this run: reusable ones (skipped, their sessions checked one by one) and new
    ones, each closed at the shard limits (`io.shards.Limits`) or where a reusable one begins.

    Results may arrive in any order (Ray hands them back as they finish); they wait here until
    every earlier position is written, so each shard is written in stream order (each session's
    samples handed on to `io.sample_parts`, which encodes the shard's part as it fills), and a
    shard is closed (its part finished, and `written(name)` told) as soon as it is full."""

    def __init__(
        self,
        run_dir: Path,
        reusable: list[shards.Marker],
        total: int,
        write_samples: bool,
        stamp: str,
        progress: Callable[[int, int], None] | None,
        observe: Callable[[Any], None] | None = None,
    ):
        self.run_dir, self.total, self.progress, self.stamp = run_dir, total, progress, stamp
        self.write_samples = write_samples
        self.limits = shards.Limits.from_env()
        self._reusable = {marker.start: marker for marker in reusable}
        self._starts = sorted(self._reusable)
        self._checked: set[int] = set()  # reusable shards whose every session was found where it recorded
        self._checking: Any = None  # digest of the ids passed so far in the reusable shard being checked
        self._written: list[shards.Marker] = []
        self.samples = sample_parts.SampleParts(run_dir, observe) if write_samples else None
        self.written: Callable[[str], None] | None = None
        self.redone: list[str] = []  # reusable shards dropped once their sessions came, and why
        self.replayed = 0
        self._next = 0  # the next position to write
        self._waiting: dict[int, rundir.SessionRows] = {}
        self._ids: dict[int, str] = {}  # position → session id, for the sessions being replayed
        self._writer: shards.ShardWriter | None = None
        self._seen = 0

    def resumed(self, position: int, session_id: str) -> bool:
        """True for a session a reusable shard holds (counted, not replayed again). A shard whose
        first session is not the one it recorded is replayed; one that goes wrong later stops the run."""
        index = bisect.bisect_right(self._starts, position) - 1
        marker = self._reusable.get(self._starts[index]) if index >= 0 else None
        if marker is None or position >= marker.end:
            self._ids[position] = session_id  # its result will need it (what its shard's marker digests)
            return False
        if position == marker.start:
            if session_id != marker.first:
                first = f"it starts with session {marker.first!r}, the dump with {session_id!r}"
                self.redone.append(f"shard {marker.name}: {first}")
                self._drop(marker)
                self._ids[position] = session_id
                return False
            self._checking = shards.IdDigest()
        self._checking.add(session_id)
        if position == marker.end - 1:
            if self._checking.value() != marker.sessions:
                raise UnusableInput(
                    f"shard {marker.name} of {self.run_dir} holds other sessions than the dump has at positions "
                    f"{marker.start}–{marker.end - 1} (its files were swapped or edited); rerun with --overwrite"
                )
            self._checked.add(marker.start)
            self._flush()
        self._tick()
        return True

    def add(self, position: int, rows: rundir.SessionRows) -> None:
        self._waiting[position] = rows
        self.replayed += rows.replayed
        self._tick()
        self._flush()

    def _flush(self) -> None:
        while self._next < self.total:
            marker = self._reusable.get(self._next)
            if marker is not None:
                if marker.start not in self._checked:
                    return  # its last session has not been checked yet
                self._close()
                self._next = marker.end
                continue
            rows = self._waiting.pop(self._next, None)
            if rows is None:
                return
            if self._writer is None:
                self._writer = shards.ShardWriter(self.run_dir, self._next, self.write_samples, self.stamp)
            stream = self._writer.add(self._ids.pop(self._next), rows)
            if stream is not None and self.samples is not None:  # its part encodes as the shard fills
                samples = stream if rows.samples is None else rows.samples  # the table, when there is one
                self.samples.append(shards.shard_name(self._writer.start), samples)
            self._next += 1
            if self._writer.full(self.limits):
                self._close()
        self._close()

    def _close(self) -> None:
        if self._writer is None:
            return
        marker = self._writer.close()
        self._writer = None
        self._written.append(marker)
        if self.samples is not None:
            self.samples.add(marker)
        if self.written is not None:
            self.written(marker.name)

    def finish(self) -> None:
        """Every result is in: nothing may still wait (a position no executor returned is a bug)."""
        assert not self._waiting and self._writer is None, "a session's result never came back"

    def abandon(self) -> None:
        """The run stops (error or interrupt): the shard being filled is left unwritten, its
        temporary file removed; sample parts not started yet are not written."""
        if self._writer is not None:
            self._writer.discard()
            self._writer = None
        if self.samples is not None:
            self.samples.abandon()

    def reused(self) -> list[shards.Marker]:
        return list(self._reusable.values())

    def markers(self) -> list[shards.Marker]:
        """Every shard of the run, reused and new, in stream order."""
        return sorted([*self._reusable.values(), *self._written], key=lambda marker: marker.start)

    def _drop(self, marker: shards.Marker) -> None:
        """A reusable shard that turned out not to be: its files go, its sessions are replayed."""
        for name in [*marker.files, f"{marker.name}.done"]:
            (self.run_dir / "shards" / name).unlink(missing_ok=True)
        del self._reusable[marker.start]
        self._starts.remove(marker.start)

    def _tick(self) -> None:
        """One more session accounted for (replayed, resumed or quarantined while loading)."""
        self._seen += 1
        if self.progress:
            self.progress(self._seen, self.total)


def replay_sessions(sessions: Iterable[Session], options: ReplayOptions, workers: int = 1) -> list[rundir.SessionRows]:
    """Rows for already loaded sessions (tests and notebooks), without a run directory."""
    return list(run_sessions(sessions, options, workers))
